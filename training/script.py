"""What trainkit gives a user's own script (`invoke run --script FILE`), on every target.

A script that torchrun can start (it reads RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT from its
environment, as `torch.distributed.init_process_group()` and Lightning's cluster environment do) runs under
trainkit with a run folder, elastic restarts, per-rank logs and `invoke status / logs / stop`. To checkpoint,
resume and show its progress it needs only this module:

    from training.script import checkpoint_dir, phase, report_step

    ckpt = checkpoint_dir()                      # runs/<run-id>/checkpoints/, on FSx on EKS
    ...                                          # resume from the newest complete checkpoint there, if any
    for step in ...:
        ...
        report_step(step, loss=loss.item())      # one line: metrics.jsonl and Prometheus, like a recipe's
        with phase("checkpoint"):                # a save may take far longer than a step
            ...

The launcher sets, for every process of the run:

    TRAINKIT_RUN_DIR         the run folder, runs/<run-id>/ (relative to the working directory; on EKS that is
                             the FSx mount); spec.json there says the job (nodes, processes, metrics port)
    TRAINKIT_CHECKPOINT_DIR  <run folder>/checkpoints/: the same path after a restart, a re-run of the same
                             command, or on another pod; write a checkpoint under a temporary name and rename it
                             when complete, so a kill mid-save never leaves a checkpoint that does not load

torchrun adds TORCHELASTIC_RESTART_COUNT (how many times the workers were restarted). The script's own folder is
copied into the run folder (<run folder>/code/<hash>/) and started from there, so its sibling modules import.

`phase("checkpoint")` and `phase("evaluate")` mark the script's own slow work, which the watchdog then allows as
long as a recipe's (a context manager around the save or the validation).

`report_step(step, loss=..., **values)` is also the step's heartbeat: the stall watchdog of the rank's torchrun agent
restarts the job from its last checkpoint when a rank reports no step for far longer than its steps take (call it on
every rank for that; docs/checkpoints.md). Rank 0 appends {"step", "loss", "time", ...} to metrics.jsonl, which
`invoke status` and `invoke obs.report` read; every rank sets its Prometheus gauges (trainkit_train_step,
trainkit_train_loss, trainkit_last_step_timestamp_seconds, and lr, samples_per_s, tokens_per_s, step_time_s when
given: training/common/metrics.py) on the job's metrics port + its local rank, where the platform scrapes a
recipe's, so dashboards, the stall alert and `invoke status` follow a script as they follow a recipe. The first
report of a process that redoes steps (a restart resumed from an earlier checkpoint) drops the lines it redoes, and
notes in events.jsonl that the run started, or resumed after the last step it reported, as a recipe does. Under
`invoke run --track mlflow` rank 0's reports also reach the run's MLflow run, as a recipe's steps do (docs/tracking.md).
Outside trainkit (no TRAINKIT_RUN_DIR) both calls work on ./runs/script/ and serve no metrics.

trainkit starts the script through this module, `python -m training.script FILE ARGS` (see `main`), so that an
uncaught exception, or a `sys.exit` with a failure such as argparse's, reaches the launcher as the run's cause
without the script changing.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import runpy
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from training.common.failure import reported
from training.common.files import append_event
from training.common.heartbeat import process_heartbeat
from training.common.lifecycle import die_with_parent
from training.spec import (
    CHECKPOINT_DIR_ENV,
    METRICS_PORT_OFFSET_ENV,
    RUN_DIR_ENV,
    SCRIPT_LABEL_ENV,
    SPEC_FILE,
    read_job,
)

OUTSIDE = Path("runs") / "script"
_sink = None


def run_dir() -> Path:
    """This run's folder (created if it is not there yet)."""
    path = Path(os.environ.get(RUN_DIR_ENV) or OUTSIDE)
    path.mkdir(parents=True, exist_ok=True)
    return path


def checkpoint_dir() -> Path:
    """Where this run keeps its checkpoints: the same folder after any restart (created if missing)."""
    path = Path(os.environ.get(CHECKPOINT_DIR_ENV) or run_dir() / "checkpoints")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _metrics():
    """The process's metrics sink, made at its first report: rank 0 writes metrics.jsonl; every rank serves its
    gauges on the job's metrics port + its local rank (+ its node's offset on a shared machine)."""
    from training.common.metrics import MetricsSink, metrics_address

    folder = run_dir()
    spec = folder / SPEC_FILE
    job = read_job(spec) if spec.is_file() else None
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    labels = {
        "run_id": job.run.run_id if job else folder.name,
        "model": os.environ.get(SCRIPT_LABEL_ENV, "script"),
        "rank": str(rank),
        "node": os.environ.get("GROUP_RANK", "0"),
    }
    port = None
    if job and job.run.metrics_port:
        port = job.run.metrics_port + int(os.environ.get(METRICS_PORT_OFFSET_ENV, 0)) + local_rank
    address = metrics_address(job.placement.target if job else "local")
    return MetricsSink(folder, labels, rank == 0, port, address)


def report_step(step: int, loss: float | None = None, **values: float) -> None:
    """Report that optimizer step `step` completed (see the module's docstring). Call it on every rank, or on rank
    0 only (then only rank 0's gauges move)."""
    global _sink
    if _sink is None:
        _sink = _metrics()
        # a resumed process redoes steps from its checkpoint: no line twice; what is kept, the run reported before
        earlier = _sink.truncate_after(step - 1)
        if _sink.is_main:  # the run's story, as a recipe tells it (`invoke status` counts the resumes)
            kind, since = ("resume", earlier[-1]["step"]) if earlier else ("start", 0)
            append_event(_sink.run_dir, kind, step=since, world_size=int(os.environ.get("WORLD_SIZE", 1)))
            spec = _sink.run_dir / SPEC_FILE
            if spec.is_file():  # `invoke run --track mlflow`: the script's steps reach MLflow as a recipe's do
                _sink.start_tracking(read_job(spec), earlier)
                atexit.register(_sink.close_tracking)
    process_heartbeat().beat(int(step))  # what the node's stall watchdog watches (training/common/heartbeat.py)
    record = {"step": int(step), "time": time.time(), **values}
    if loss is not None:
        record["loss"] = float(loss)
    _sink.log_step(record)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """`with phase("checkpoint"):` (or `"evaluate"`) around the script's own slow work: the stall watchdog allows it
    what it allows a recipe's (at least 10 min and --stall-timeout; a checkpoint also 10 x the run's longest one,
    which rank 0 records as a `checkpoint` event with its seconds, as a recipe does) instead of a step's. A Lightning
    Trainer gets this from training/lightning.py's callback."""
    heartbeat = process_heartbeat()
    started = time.monotonic()
    with heartbeat.phase(name):
        yield
    if name == "checkpoint":
        record_checkpoint(heartbeat.step, time.monotonic() - started)


def record_checkpoint(step: int, seconds: float) -> None:
    """Rank 0's `checkpoint` event: how long the save at `step` took, which the stall watchdog's next round of
    workers allows ten times of (trainkit/run/watchdog.py seeded_longest). Outside a trainkit job, nothing."""
    if os.environ.get(RUN_DIR_ENV) and int(os.environ.get("RANK", 0)) == 0:
        with contextlib.suppress(OSError):  # a full volume: the run's story loses a line, not its run
            append_event(run_dir(), "checkpoint", step=int(step), seconds=round(seconds, 3))


def main(argv: list[str] | None = None) -> None:
    """`python -m training.script FILE [ARGS]`: run FILE as `python FILE ARGS` would (as `__main__`, its own folder
    first on sys.path, FILE ARGS as sys.argv, the same exit), inside the failure channel's `reported(exits=True)`, and
    ended with the agent that started it.

    trainkit's package is called `training`, a name a user's project may use too. So the launcher starts this module
    with PYTHONSAFEPATH (Python 3.11+), which keeps the working directory, where such a package may lie, off sys.path
    while `-m training.script` is found (RUNNER_ENV); it is cleared here for whatever the script starts. And when
    the script's folder has its own `training` package, trainkit's is taken out of sys.modules before the script
    runs, so the script imports its own, as under `python FILE` (it cannot then use this module's API)."""
    words = sys.argv[1:] if argv is None else argv
    if not words:
        raise SystemExit("usage: python -m training.script FILE [ARGS ...]")
    path = os.path.abspath(words[0])
    folder = os.path.dirname(path)
    for name in RUNNER_ENV:
        os.environ.pop(name, None)
    sys.argv = list(words)
    sys.path.insert(0, folder)
    die_with_parent()
    with reported(exits=True):
        if any(os.path.exists(os.path.join(folder, f"{__package__}{end}")) for end in ("", ".py")):
            for name in [name for name in sys.modules if name.partition(".")[0] == __package__]:
                del sys.modules[name]
        runpy.run_path(path, run_name="__main__")


RUNNER_ENV = {"PYTHONSAFEPATH": "1"}
"""What the processes that start a script through `main` get, and `main` takes away again (see there)."""


if __name__ == "__main__":
    main()
