"""What every trainer shares around its loop: resume, checkpoint, metrics, the finished-run check.

A trainer owns its model, data and step; `RunContext` owns `runs/<run-id>/`: the checkpoint
directory (atomic publish, see checkpoint.py), metrics.jsonl and the Prometheus gauges, the restart
count, and summary.json. Both workloads use it, so a resumed or finished run behaves the same way
whatever is being trained.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from tqdm import tqdm

from .checkpoint import CheckpointManager
from .metrics import MetricsSink


def peak_memory_bytes() -> int:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class RunContext:
    def __init__(
        self,
        accelerator: Accelerator,
        run_dir: str | Path,
        run_id: str,
        model_name: str,
        keep_checkpoints: int,
        metrics_port: int,
        nodes: int,
    ):
        self.accelerator = acc = accelerator
        self.run_dir = Path(run_dir)
        self.run_id, self.model_name = run_id, model_name
        self.started = time.perf_counter()
        self.checkpoints = CheckpointManager(
            self.run_dir / "checkpoints", keep_checkpoints, acc.is_main_process, acc.wait_for_everyone
        )
        world = acc.num_processes
        labels = {
            "run_id": run_id,
            "model": model_name,
            "rank": str(acc.process_index),
            "node": str(acc.process_index // max(1, world // nodes)),
        }
        port = metrics_port + acc.local_process_index if metrics_port else None
        self.metrics = MetricsSink(self.run_dir, labels, acc.is_main_process, port)
        self.restarts = 0

    def resume(self) -> int:
        """Load `latest` if there is one (every object registered with the accelerator); returns the next step."""
        self.checkpoints.clean_partial()
        latest = self.checkpoints.latest()
        if latest is None:
            return 0
        self.accelerator.load_state(str(latest))
        state = self.checkpoints.read_state(latest)
        self.restarts = state.get("restarts", 0) + 1
        self.metrics.truncate_after(state["step"])
        self.metrics.set("trainkit_restarts", self.restarts)
        return state["step"]

    def already_finished(self, start: int, total_steps: int) -> bool:
        """A finished run is reported and left as it is; the caller returns."""
        if start < total_steps or not (self.run_dir / "summary.json").exists():
            return False
        if self.accelerator.is_main_process:
            print(
                f"run {self.run_id} already finished at step {start}; outputs in {self.run_dir} "
                "(pass a new --run-id or more --steps to train again)",
                flush=True,
            )
        self.accelerator.end_training()
        return True

    def progress(self, start: int, total_steps: int) -> tqdm:
        """A step progress bar on the main process (silent elsewhere)."""
        quiet = not self.accelerator.is_main_process
        return tqdm(total=total_steps, initial=start, disable=quiet, desc=self.run_id, unit="step")

    def save(self, step: int, total_steps: int) -> None:
        started = time.perf_counter()
        self.checkpoints.save(
            step,
            lambda directory: self.accelerator.save_state(str(directory)),
            {"restarts": self.restarts, "total_steps": total_steps, "model": self.model_name},
        )
        self.metrics.set("trainkit_checkpoint_duration_seconds", time.perf_counter() - started)

    def save_final(self, total_steps: int) -> None:
        """The last step is always checkpointed (once), so a finished run can be recognised and resumed from."""
        latest = self.checkpoints.latest()
        if latest is None or self.checkpoints.read_state(latest)["step"] != total_steps:
            self.save(total_steps, total_steps)

    def write_summary(self, start: int, extra: dict) -> None:
        """summary.json on the main rank: medians from metrics.jsonl plus what the trainer adds."""
        if not self.accelerator.is_main_process:
            return
        common = {
            "run_id": self.run_id,
            "model": self.model_name,
            "world_size": self.accelerator.num_processes,
            "resumed_from": start or None,
            "restarts": self.restarts,
            "wall_time_s": time.perf_counter() - self.started,
        }
        path = self.metrics.write_summary({**common, **extra})
        print(f"summary: {path}", flush=True)
