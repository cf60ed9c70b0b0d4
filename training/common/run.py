"""What every trainer shares around its loop: resume, checkpoint, metrics, the finished-run check.

A trainer owns its model, data and step; `RunContext` owns `runs/<run-id>/`: the checkpoint
directory (atomic publish, see checkpoint.py), metrics.jsonl and the Prometheus gauges, the restart
count, events.jsonl (every start, resume, checkpoint and stop, with wall-clock times: the run's
history across restarts, which metrics.jsonl does not keep), the stop-at-step-boundary handling and
summary.json. Both workloads use it, so a resumed or finished run behaves the same way
whatever is being trained.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch.distributed.checkpoint import CheckpointException

from training.spec import METRICS_PORT_OFFSET_ENV, Job

from .best import BEST_POINTER
from .checkpoint import CHECKPOINTS_DIR, CheckpointManager, check_manifest, step_dir_name, step_of_dir
from .distributed import on_any_rank
from .failure import NoRetry, doing, root_cause
from .faults import hang_here
from .files import EVENTS_FILE, append_event, publish_text, read_events
from .heartbeat import process_heartbeat
from .lifecycle import StopSignal
from .metrics import MetricsSink, metrics_address
from .profiling import StepProfile
from .progress import progress_display
from .training_state import AcceleratorCheckpoint, TrainingState
from .weights_only import load_weights_only

# Exit code of a worker that stops because a rank on another node was asked to stop: its agent
# restarts it (one of --max-restarts) and it resumes from the checkpoint written on the way out.
EXIT_PEER_STOPPED = 75
NOT_FINITE_FILE = "not-finite.json"
# Fault injection for tests: rank 0 waits this many seconds before publishing the finished run, so a test
# can show that no rank (and no pod) leaves before the run is published.
PUBLISH_DELAY_ENV = "TRAINKIT_TEST_PUBLISH_DELAY_S"


def current_nodes(configured: int) -> int:
    """Nodes in this round of an elastic job (torchrun's GROUP_WORLD_SIZE), else the configured count."""
    return int(os.environ.get("GROUP_WORLD_SIZE", configured))


class Diverged(NoRetry):
    """The loss or the gradient norm stopped being finite: any restart would only repeat it (the run refuses to
    resume, see RunContext.refuse_if_diverged), so every rank ends with EXIT_NO_RETRY."""


class RunContext:
    def __init__(
        self, accelerator: Accelerator, job: Job, run_dir: Path, nodes: int, state: TrainingState | None = None
    ):
        """`nodes`: in this round of the job (current_nodes), which may be fewer than the job's. `state`: what a
        checkpoint holds; default: everything the Accelerator prepared (a DeepSpeed engine brings its own)."""
        self.accelerator = acc = accelerator
        self.state = state or AcceleratorCheckpoint(accelerator)
        self.run_dir, self.job = run_dir, job
        self.run_id, self.model_name = run_id, model_name = job.run.run_id, job.model.name
        keep_checkpoints, metrics_port = job.checkpointing.keep_checkpoints, job.run.metrics_port
        self.started = time.perf_counter()
        self.checkpoints = CheckpointManager(
            self.run_dir / CHECKPOINTS_DIR,
            keep_checkpoints,
            acc.is_main_process,
            acc.wait_for_everyone,
            is_local_main=acc.is_local_main_process,
        )
        world = acc.num_processes
        labels = {
            "run_id": run_id,
            "model": model_name,
            "rank": str(acc.process_index),
            "node": str(acc.process_index // max(1, world // nodes)),
        }
        offset = int(os.environ.get(METRICS_PORT_OFFSET_ENV, 0))
        port = metrics_port + offset + acc.local_process_index if metrics_port else None
        address = metrics_address(job.placement.target)
        self.metrics = MetricsSink(self.run_dir, labels, acc.is_main_process, port, address)
        self.restarts = 0
        self.events = self.run_dir / EVENTS_FILE
        self.stop_signal = StopSignal().install()
        self.heartbeat = process_heartbeat()  # what the node's stall watchdog reads (trainkit/run/watchdog.py)
        self.saved_step: int | None = None
        self.save_seconds = 0.0
        self.profile = StepProfile()  # TRAINKIT_PROFILE_STEPS, set by `invoke bench train`
        self.trainer_state: dict = {}
        """What the trainer keeps in every checkpoint's trainer state besides the step (the best evaluation so far,
        an early stop); `resumed_state` is the resumed checkpoint's."""
        self.resumed_state: dict = {}
        self.start_fields: dict = {}
        """More of what this start is, for its start/resume event (a language model's data: tokenised or cached)."""

    def log_step(self, record: dict) -> None:
        """One step's metrics record, flagged `profiled` when it ran under the profiler (its overhead stays out of
        the medians)."""
        if self.profile.profiled(record["step"]):
            record["profiled"] = True
        with doing(f"writing step {record['step']}'s metrics"):
            self.metrics.log_step(record)

    def event(self, kind: str, **fields) -> None:
        """Append one line to events.jsonl (main rank)."""
        if self.accelerator.is_main_process:
            with doing(f"writing the {kind} event"):
                append_event(self.run_dir, kind, **fields)

    def resume(self) -> int:
        """Load the newest checkpoint that is whole (every object registered with the accelerator); returns the
        next step. One that does not match its manifest or does not load on some rank is set aside with the
        reason (an event, a line on the console) and the next older one is tried; none left: the processes
        exit to be restarted fresh (they may hold part of a failed load), and train from the start."""
        self.checkpoints.clean_partial()
        latest, step, set_aside = None, 0, []
        while (candidate := self._agreed(self.checkpoints.latest())) is not None:
            reason = self._unusable(candidate)
            if reason is None:
                latest = candidate
                break
            set_aside.append(candidate.name)
            kept = self.checkpoints.set_aside(candidate, reason)
            after = self.checkpoints.latest()
            self.event("checkpoint_set_aside", checkpoint=candidate.name, reason=reason, kept_as=kept.name)
            if self.accelerator.is_main_process:
                print(
                    f"checkpoint {candidate.name} is not usable ({reason}); kept as checkpoints/{kept.name}, "
                    f"resuming from {after.name if after else 'the start'}",
                    flush=True,
                )
        if latest is None and set_aside:
            # A load that failed part-way may have left some of its state in the model or the optimizer: this
            # process is not trained on. Its agent starts fresh processes, which find no checkpoint and train
            # from the start (one of --max-restarts); the set-aside checkpoints stay for a look.
            if self.accelerator.is_main_process:
                print(
                    f"no usable checkpoint left ({', '.join(set_aside)} set aside); restarting the processes to "
                    "train from the start",
                    flush=True,
                )
            raise SystemExit(EXIT_PEER_STOPPED)
        if latest is not None:
            state = self.resumed_state = self.checkpoints.read_state(latest)
            self.restarts = state.get("restarts", 0) + 1
            step = self.saved_step = state["step"]
        kept = self.metrics.truncate_after(step)  # lines of steps after the checkpoint (all, without one) are redone
        self.metrics.start_tracking(self.job, kept)
        # Exported from the start (0), so the first restart is a change a rule can see.
        self.metrics.set("trainkit_restarts", self.restarts)
        self.metrics.set("trainkit_stall_restarts", self._stall_restarts())
        self.event(
            "resume" if latest is not None else "start",
            step=step,
            world_size=self.accelerator.num_processes,
            restarts=self.restarts,
            agent_restarts=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
            **self.start_fields,
        )
        self.heartbeat.beat(step)  # the watchdog watches this process's steps from here
        return step

    def _stall_restarts(self) -> int:
        """How many of the run's resumes followed a stall: starts and resumes in events.jsonl with a `stalled` event
        of a node's watchdog before them, since the one before (on several nodes each node may record one)."""
        count, stalled = 0, False
        for record in read_events(self.run_dir):
            kind = record.get("event")
            if kind == "stalled":
                stalled = True
            elif kind in ("start", "resume"):
                count, stalled = count + stalled, False
        return count + stalled  # this resume, when a stall came after the last one

    def _agreed(self, candidate: Path | None) -> Path | None:
        """The checkpoint every rank tries: the oldest of the ranks' newest whole ones, None everywhere when a rank
        has none. Hosts that share no disk (SageMaker) each find their own, and a restore's timing can leave one a
        step behind another (trainkit/backends/sagemaker/restore.py): a step whole on one host only is then not
        whole here (`_unusable` says so on every rank), and the ranks go back together, never apart."""
        step = agreed_step(step_of_dir(candidate.name) if candidate else None, self.accelerator.device)
        return None if step is None else self.checkpoints.root / step_dir_name(step)

    def _unusable(self, checkpoint: Path) -> str | None:
        """Why `checkpoint` cannot be resumed from (None: it loaded), the same answer on every rank."""
        reason = check_manifest(checkpoint)
        if reason is None:
            try:
                load_weights_only(checkpoint, self.state.load, self.state.safe_globals)
            except NoRetry:  # the checkpoint is sound and this job cannot take it (it says why): not set aside
                raise
            # A shard that does not parse, whatever the reader raises; a refused pickle; what DCP's load gathers from
            # every rank into a CheckpointException, a BaseException (torch/distributed/checkpoint/api.py), named by
            # its lowest rank's error.
            except (Exception, CheckpointException) as error:
                cause = root_cause(error)
                first = (str(cause).strip().splitlines() or [""])[0][:200]
                reason = f"it does not load: {type(cause).__name__}: {first}"
        (failed,) = self._any_rank(reason is not None)
        if failed and reason is None:
            reason = "it does not load on another rank"
        return reason

    def already_finished(self, total_steps: int) -> bool:
        """A finished run is reported and left as it is; the caller returns. Decided from the run's small
        files (summary.json and the latest checkpoint's trainer_state.json), before any checkpoint is
        loaded: a finished run of a 70B model does not read its weights only to say so."""
        latest = self.checkpoints.latest()
        if latest is None or not (self.run_dir / "summary.json").exists():
            return False
        state = self.checkpoints.read_state(latest)
        step, early = state["step"], state.get("stopped_early")
        if step < total_steps and not early:
            return False
        if self.accelerator.is_main_process:
            how = "stopped early" if early else "finished"
            print(
                f"run {self.run_id} already {how} at step {step}; outputs in {self.run_dir} "
                "(pass a new --run-id or more --steps to train again)",
                flush=True,
            )
            # Steps its tracking server never got (it was away at the end) are sent now.
            self.metrics.start_tracking(self.job, self.metrics.read_records())
            self.metrics.close_tracking()
        self.accelerator.end_training()
        return True

    def progress(self, start: int, total_steps: int):
        """Step progress on the main process (silent elsewhere): training/common/progress.py."""
        return progress_display(self.run_id, start, total_steps, quiet=not self.accelerator.is_main_process)

    def check_finite(self, step: int, loss: float, grad_norm: float) -> None:
        """Stop the job at the first step whose loss or gradient norm is not finite, before anything of it is
        checkpointed or logged. Both are reduced over all ranks, so every rank stops at the same step; the
        run records why (not-finite.json, an event) and refuses to resume, since a restart would only
        repeat the same steps."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            return
        what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {grad_norm}"
        saved = f"the last checkpoint (step {self.saved_step}) is kept" if self.saved_step else "no checkpoint was made"
        message = (
            f"training diverged at step {step}: {what} (rank {self.accelerator.process_index}); {saved}. "
            "Lower --lr, raise --warmup-steps or set --grad-clip, and start again with the new values"
        )
        if self.accelerator.is_main_process:
            publish_text(self.run_dir / NOT_FINITE_FILE, json.dumps({"step": step, "what": what}) + "\n")
            self.event("not_finite", step=step, what=what)
        raise Diverged(message)

    def refuse_if_diverged(self) -> None:
        """A run that stopped on a non-finite value is not resumed (its settings are what diverged)."""
        marker = self.run_dir / NOT_FINITE_FILE
        if marker.exists():
            found = json.loads(marker.read_text())
            raise Diverged(
                f"run {self.run_id} stopped at step {found['step']} ({found['what']}); it is not resumed: "
                "change --lr, --warmup-steps or --grad-clip (a new run id) to train again"
            )

    def save(self, step: int, total_steps: int) -> None:
        started = time.perf_counter()
        with doing(f"writing checkpoint {step_dir_name(step)}"), self.heartbeat.phase("checkpoint"):
            hang_here("checkpoint", step, lambda: self.stop_signal.pending)
            self.checkpoints.save(
                step,
                self.state.save,
                {"restarts": self.restarts, "total_steps": total_steps, "model": self.model_name, **self.trainer_state},
            )
        self.save_seconds = time.perf_counter() - started
        self.saved_step = step
        self.metrics.set("trainkit_checkpoint_duration_seconds", self.save_seconds)
        self.event("checkpoint", step=step, seconds=round(self.save_seconds, 3))

    def protect(self, step: int) -> None:
        """Keep this step's checkpoint apart from the rolling --keep-checkpoints (the best evaluation's)."""
        self.checkpoints.protected = {step_dir_name(step)}

    def mark_best(self, step: int) -> None:
        """Name the step's published checkpoint as the best evaluation's (checkpoints/best), after its save."""
        if self.accelerator.is_main_process:
            publish_text(self.checkpoints.root / BEST_POINTER, step_dir_name(step) + "\n")
        self.accelerator.wait_for_everyone()

    def load_checkpoint(self, step: int) -> None:
        """Load a kept checkpoint of this run into the model (the best one, for the export), on every rank."""
        with doing(f"loading checkpoint {step_dir_name(step)}"):
            self.state.load(self.checkpoints.root / step_dir_name(step))
        self.accelerator.wait_for_everyone()

    def stop_requested(self) -> tuple[bool, bool]:
        """(stop now, a checkpoint fits in the time left): every rank's answer, agreed by one all-reduce.

        Called once per step on every rank. Any rank that received SIGTERM/SIGINT stops the whole job at
        this step boundary; the checkpoint is skipped when any stopping rank would run out of grace time.
        """
        stop = self.stop_signal
        requested, no_time = self._any_rank(stop.pending, not stop.time_allows(self.save_seconds))
        return requested, not no_time

    def _any_rank(self, *flags: bool) -> tuple[bool, ...]:
        return on_any_rank(*flags, device=self.accelerator.device)

    def after_step(self, step: int, total_steps: int, interval: int, save_anyway: bool = False) -> None:
        """Every step boundary but the last (which save_final covers): checkpoint every `interval` steps
        (0: never) or when the trainer asks (`save_anyway`, e.g. an epoch end), then stop here if a stop
        was asked for."""
        self.heartbeat.beat(step)
        if step == total_steps:
            return
        if save_anyway or (interval and step % interval == 0):
            self.save(step, total_steps)
        self.stop_if_requested(step, total_steps)

    def stop_if_requested(self, step: int, total_steps: int) -> None:
        """At a step boundary: when a stop was asked for, checkpoint (time allowing) and exit."""
        requested, time_allows = self.stop_requested()
        if not requested:
            return
        saved = time_allows and self.saved_step != step
        if saved:
            self.save(step, total_steps)
        own = self.stop_signal.signum
        self.event("stop", step=step, checkpoint=self.saved_step if saved else None, signal=own)
        why = f"signal {own}" if own else "a rank on another node is stopping"
        kept = f"checkpoint at step {step} saved" if saved else f"last checkpoint: step {self.saved_step}"
        print(f"rank {self.accelerator.process_index}: stopping at step {step} ({why}); {kept}", flush=True)
        raise SystemExit(128 + own if own else EXIT_PEER_STOPPED)

    def save_final(self, total_steps: int) -> None:
        """The last step is always checkpointed (once), so a finished run can be recognised and resumed from."""
        latest = self.checkpoints.latest()
        if latest is None or self.checkpoints.read_state(latest)["step"] != total_steps:
            self.save(total_steps, total_steps)

    def finish(self, start: int, extra: dict, eval_metric: str | None = None, lower_is_better: bool = True) -> None:
        """Publish the finished run, then let the ranks go: rank 0 writes summary.json (medians from
        metrics.jsonl plus what the trainer adds) and the `finish` event, both fsynced, while every other
        rank waits at a barrier. Checkpoint and exported model are already on disk (save_final, export).

        The barrier is what keeps a run whole on EKS: training-operator v1.9.4 marks an elastic
        PyTorchJob Succeeded as soon as any Worker pod succeeds and `cleanPodPolicy: Running` then deletes
        the pods still running (pkg/controller.v1/pytorch/pytorchjob_controller.go, the status update;
        pkg/controller.v1/common/job.go): a node whose ranks left first would have the pod of rank 0
        deleted mid-write. torchrun's agents also wait for each other before exiting (the elastic agent's
        exit barrier), but only up to 300 s and they carry on when that barrier fails; here no rank leaves
        before the run is published, within the job's collective timeout."""
        if self.accelerator.is_main_process:
            time.sleep(float(os.environ.get(PUBLISH_DELAY_ENV, 0)))
            common = {
                "run_id": self.run_id,
                "model": self.model_name,
                "world_size": self.accelerator.num_processes,
                "resumed_from": start or None,
                "restarts": self.restarts,
                "wall_time_s": time.perf_counter() - self.started,
            }
            if self.profile.report:
                common["profile"] = self.profile.report
            with doing("writing summary.json"):
                path = self.metrics.write_summary({**common, **extra}, eval_metric, lower_is_better)
            self.event("finish", step=json.loads(path.read_text())["steps"])
            print(f"summary: {path}", flush=True)
            self.metrics.close_tracking()
        self.accelerator.wait_for_everyone()
        if not self.accelerator.is_main_process:  # rank 0's console ends with the summary
            print(f"rank {self.accelerator.process_index}: run published by rank 0, leaving", flush=True)


def agreed_step(step: int | None, device: torch.device | str = "cpu") -> int | None:
    """The smallest of every rank's `step` (None: this rank has none, which wins), by one MIN all-reduce; `step`
    itself in a single process."""
    value = torch.tensor([-1 if step is None else step], dtype=torch.long, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
    found = int(value.item())
    return None if found < 0 else found
