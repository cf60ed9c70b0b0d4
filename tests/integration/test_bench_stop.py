"""A bench run has its own process session (so a timeout can take torchrun's whole group), which also hides it
from a Ctrl-C or SIGTERM sent to the bench: the bench ends the run's group itself when it is interrupted, and a
stop after it leaves no process of the run behind (CI 24 found an interrupted bench's torchrun still running), and
says which run it stopped and where its log is (CI 59 found a bench stopped by the suite's timeout with no trace of
where)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.helpers.paths import REPO

BENCH = """
import signal, sys
from pathlib import Path
from trainkit.bench.train import _run, stop_on_sigterm

# Ctrl-C as a terminal delivers it: a process started in the background of a script (as CI runs the suite)
# inherits SIGINT ignored, and Python then raises no KeyboardInterrupt for it
signal.signal(signal.SIGINT, signal.default_int_handler)
stop_on_sigterm()
# the "run": a shell that starts a child and waits, as torchrun starts its workers
_run(["bash", "-c", f"sleep {sys.argv[1]} & wait"], Path(sys.argv[2]))
"""


def _alive(marker: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    return found.stdout.split()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_bench_ends_its_runs_whole_group(tmp_path, sig):
    marker = f"{3000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"  # a sleep no one else runs
    log = tmp_path / "run.log"
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCH, marker, str(log)], cwd=REPO, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 30
    while not _alive(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(marker), "the run's child never started"
    os.kill(bench.pid, sig)
    _, err = bench.communicate(timeout=30)
    assert bench.returncode != 0
    assert f"bench stopped during `bash -c sleep {marker} & wait ...`; its log: {log}" in err  # where it was
    deadline = time.monotonic() + 15
    while _alive(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(marker) == []
