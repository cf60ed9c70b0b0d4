"""`invoke bench restart`: how long a local run takes from losing a rank to its next optimizer step (issue 51). The
model (`--model`; the docs quote llama2-tiny and bert-tiny) trains on 2 processes; once it is past a checkpoint, one
rank's worker is SIGKILLed
(what a crashed process or an OOM kill leaves), torchrun restarts the group, every rank imports its trainer again,
loads the checkpoint and trains on. Measured: seconds from the kill to the first step record written after it,
repeated. Users pay this at every elastic restart, stall restart and spot resume; most of it is the workers'
imports.

`--checkout DIR` times another checkout of trainkit with the same interpreter (its code first on the path), for a
before/after comparison, as `invoke bench startup` does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from training.common.files import read_jsonl
from trainkit.bench.checkout import Checkout, add_record, machine

KILL_AFTER_STEP = 6
"""The kill comes once the step-4 checkpoint is published and the run has gone on past it."""
POLL_S = 0.02


def _worker_of_rank(run_dir: Path, rank: int) -> int | None:
    """The pid of the worker process of `rank` (its environment names the run folder and the rank)."""
    wanted = {f"TRAINKIT_RUN_DIR={run_dir}".encode(), f"RANK={rank}".encode()}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            entries = set(environ.read_bytes().split(b"\0"))
            cmdline = (environ.parent / "cmdline").read_bytes()
            if wanted <= entries and b"torch.distributed.run" not in cmdline and b"trainkit.run.agent" not in cmdline:
                return int(environ.parent.name)
    return None


def _last_step(run_dir: Path) -> int:
    return max((r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "step" in r), default=0)


def restart_once(command: list[str], run_dir: Path, env: dict, cwd: Path, timeout_s: float = 600) -> dict:
    """One run: kill rank 1's worker after KILL_AFTER_STEP, then the seconds to the next step record."""
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout_s
    try:
        while _last_step(run_dir) < KILL_AFTER_STEP:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{' '.join(command)} ended before step {KILL_AFTER_STEP}:\n{process.stdout.read()}")
            time.sleep(POLL_S)
        victim = _worker_of_rank(run_dir, 1)
        if victim is None:
            raise SystemExit(f"no worker of rank 1 found for {run_dir}")
        records_before = len(read_jsonl(run_dir / "metrics.jsonl"))
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        while len(read_jsonl(run_dir / "metrics.jsonl")) <= records_before:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{' '.join(command)} took no step after the kill:\n{process.stdout.read()}")
            time.sleep(POLL_S)
        after = read_jsonl(run_dir / "metrics.jsonl")[records_before]
        seconds = round(float(after["time"]) - killed_at, 2) if "time" in after else None
        resumed = [e for e in read_jsonl(run_dir / "events.jsonl") if e.get("event") == "resume"]
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
        return {"kill_to_next_step_s": seconds, "resumed_from": resumed[-1]["step"] if resumed else None}
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def bench(output: str | None, model: str, repeats: int, checkout: str | None, workdir: str | None) -> Path:
    source = Checkout.of(checkout)
    work = Path(workdir or tempfile.mkdtemp(prefix="trainkit-restart-"))
    flags = ["--nproc", "2", "--steps", "12", "--checkpoint-interval", "4", "--metrics-port", "0"]
    flags += ["--log-interval", "1"]
    results = []
    for repeat in range(repeats):
        runs = work / f"runs-{repeat}"
        shutil.rmtree(runs, ignore_errors=True)
        command = source.invoke("train", "--model", model, *flags, "--runs-dir", str(runs), "--run-id", "restart")
        results.append(restart_once(command, runs / "restart", source.env(), source.repo))
        print(f"{model} {repeat + 1}/{repeats}: {results[-1]}", flush=True)
    record = {
        "what": "invoke bench restart: SIGKILL of rank 1's worker after step 6 (checkpoint every 4) of a 2-process "
        "CPU run, to the first step record after it",
        "command": " ".join(["invoke", "train", "--model", model, *flags]),
        "checkout": source.label(),
        **machine(),
        "runs": results,
        "kill_to_next_step_s_median": statistics.median(v["kill_to_next_step_s"] for v in results),
    }
    path = add_record(Path(output or "benchmarks/restart-cpu.json"), f"{record['checkout']} {model}", record)
    if workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return path
