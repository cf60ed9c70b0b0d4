"""Run the product the way a user does (invoke) and read what it leaves."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

from tests.helpers.paths import BIN, REPO
from tests.helpers.waiting import latest_step, wait_for
from training.common.files import read_jsonl as read_jsonl  # the product's reader, for the tests that import it here
from training.common.tracking import ARTIFACTS_DIR


def invoke(
    *args: str, env: dict | None = None, timeout: float = 600, drop_env_prefix: str | None = None
) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not (drop_env_prefix and k.startswith(drop_env_prefix))}
    return subprocess.run(
        [str(BIN / "invoke"), *args],
        cwd=REPO,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def invoke_in(folder: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`invoke ARGS` as a user types it in `folder` (the README's commands): the tasks come from the checkout."""
    return subprocess.run(
        [str(BIN / "invoke"), "--search-root", str(REPO), *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


_STARTED: list[subprocess.Popen] = []


def torchrun(nproc: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node N ARGS` from the checkout (workers import training/ from it)."""
    return subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(nproc), *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_invoke(*args: str, env: dict | None = None) -> subprocess.Popen:
    """Start a command in the background; whatever a test leaves running is stopped after it
    (tests/conftest.py's stop_background_jobs calls stop_started()).

    Output goes to a file (a pipe nobody reads would fill up and stall the job); `output(process)`
    reads it.
    """
    log = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen(
        [str(BIN / "invoke"), *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    process.log = log
    _STARTED.append(process)
    return process


def output(process: subprocess.Popen) -> str:
    process.log.seek(0)
    return process.log.read()


def stop_started() -> None:
    """Stop every command start_invoke started that is still running."""
    while _STARTED:
        process = _STARTED.pop()
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # the launcher stops its whole job
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def tiny_args(runs: Path, *extra: str) -> list[str]:
    """`invoke train` arguments for llama2-tiny into `runs` with --metrics-port 0; `extra` adds flags."""
    return ["train", "--model", "llama2-tiny", "--runs-dir", str(runs), "--metrics-port", "0", *extra]


def job_processes(marker: str) -> list[str]:
    """Command lines of live processes that belong to a run (its run dir is on their command line)."""
    ps = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if marker in line and "ps -eo" not in line]


def is_run_folder(path: Path) -> bool:
    """Not `.cache` (the tokenised data) nor the embedded MLflow store's artifacts (training/common/tracking.py)."""
    return path.is_dir() and not path.name.startswith(".") and path.name != ARTIFACTS_DIR


def run_folder(runs_dir: Path) -> Path | None:
    """The first run folder in `runs_dir`, or None while there is none."""
    return next((p for p in runs_dir.iterdir() if is_run_folder(p)), None)


def killed_after_checkpoint(runs_dir: Path, step: int, *args: str, env: dict | None = None) -> tuple[int, Path, int]:
    """`invoke *args` started into `runs_dir`, and its whole job SIGKILLed (launcher, agents, workers: what a lost
    machine leaves) once a checkpoint at `step` or later is published: (the launcher's pid, the run folder, the step
    a re-run resumes from)."""
    process = start_invoke(*args, env=env)
    run_dir = wait_for(lambda: run_folder(runs_dir), 60, "run dir")
    wait_for(lambda: latest_step(run_dir) >= step, 300, f"a checkpoint at step {step} or later")
    os.killpg(int((run_dir / "launcher.pid").read_text()), signal.SIGKILL)
    process.kill()
    process.wait()
    return process.pid, run_dir, latest_step(run_dir)


def only_run_dir(runs_dir: Path) -> Path:
    runs = [p for p in runs_dir.iterdir() if is_run_folder(p)]
    assert len(runs) == 1, runs
    return runs[0]
