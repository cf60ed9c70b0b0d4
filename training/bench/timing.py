"""What the bare reference loops of `invoke bench train` share: their command line and process group, the
optimizer phase timed as trainkit's trainers time it (the device synchronised at each edge), the per-step record,
and rank 0's results file."""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import NoReturn

import torch
import torch.distributed as dist

from training.common.distributed import DEFAULT_COLLECTIVE_TIMEOUT_S, peak_memory_bytes, resolve_precision, synchronize
from training.common.files import publish_text
from training.common.lifecycle import exit_finished
from training.spec import read_job


def setup(argv: list[str] | None, description: str) -> SimpleNamespace:
    """`--spec runs/<id>/spec.json --out results.json`, then this rank's device and process group (NCCL on GPUs,
    Gloo on CPU): job, run_dir, out, gpu, local_rank, device, bf16 (what trainkit's Accelerator gets)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--spec", required=True, type=Path, help="spec.json of a run folder trainkit prepared")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    job = read_job(args.spec)
    gpu = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if gpu:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    # Every collective bounded, as trainkit's own (training/common/distributed.py): a peer that stops answering
    # fails the loop instead of hanging it.
    timeout = timedelta(seconds=DEFAULT_COLLECTIVE_TIMEOUT_S)
    dist.init_process_group("nccl" if gpu else "gloo", device_id=device if gpu else None, timeout=timeout)
    bf16 = resolve_precision(job.parallelism.precision) == "bf16"
    return SimpleNamespace(
        job=job, run_dir=args.spec.parent, out=args.out, gpu=gpu, local_rank=local_rank, device=device, bf16=bf16
    )


def optimizer_phase(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    """Clip, step and zero the gradients; the seconds it took, from the end of backward."""
    synchronize()
    started = time.perf_counter()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    synchronize()
    return time.perf_counter() - started


def step_record(step: int, loss: float, started: float, data_s: float, optimizer_s: float, rate: dict) -> dict:
    """One step as the bench reads trainkit's metrics.jsonl: `rate` is {"tokens_per_s" or "samples_per_s": items
    in the step}; `time` is the wall clock after the step."""
    step_s = time.perf_counter() - started
    record = {"step": step, "loss": loss, "step_time_s": step_s, "data_wait_s": data_s, "optimizer_s": optimizer_s}
    return record | {key: items / step_s for key, items in rate.items()} | {"time": time.time()}


def finish(out: Path, what: dict, steps: list[dict]) -> NoReturn:
    """Rank 0 writes the results file; no rank tears its process group down while rank 0 still writes (gloo
    aborted there once). Then every rank leaves without interpreter teardown, as trainkit's workers do
    (lifecycle.exit_finished): at teardown DDP's reducer, the last owner of the gloo group, joined gloo's threads
    while holding the GIL one of them waited for, and that rank hung for good (a fresh-clone CI run; 1 bench in 5
    here under load; py-spy: ~ProcessGroupGloo in std::thread::join)."""
    if dist.get_rank() == 0:
        record = {**what, "world_size": dist.get_world_size(), "peak_memory_bytes": peak_memory_bytes()}
        publish_text(out, json.dumps({**record, "steps": steps}, indent=2) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    exit_finished()
