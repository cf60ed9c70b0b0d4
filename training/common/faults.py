"""Hangs that tests inject into a run, to show that the stall watchdog (trainkit/run/watchdog.py) finds each kind.
Never set by a user; unset, every call here returns at once.

    TRAINKIT_TEST_HANG="sigstop@1:8,data@0:14"

Each entry is `<kind>@<global rank>:<step>[*<times>]`: while training step <step> (1-based), that rank hangs, once
per run, or the first <times> times the run gets there (a
marker in the run folder, which every node shares, or in MARKERS_ENV's folder where the nodes share none, as
SageMaker's hosts: the rank that redoes the step after the restart, on whichever node, goes on; an agent's own
restart count would not do, since an agent that restarts for a peer's new round does not count one):

- sigstop:  freezes its whole process (SIGSTOP to itself), as seen from outside when a host stalls;
- sleep:    sleeps in the step, before the forward pass: a hang outside any collective;
- deadlock: takes a lock it already holds, in the step: a deadlock outside any collective, blocked in C;
- data:     never gets its batch (the read of the step's data does not return);
- slowsave: takes SLOW_SAVE_ENV seconds (default 10) longer over the checkpoint saved after step <step>, then goes on:
            a save far slower than the steps, which the watchdog must not take for a hang;
- hold:     waits in the checkpoint saved after step <step> until a file RELEASE_FILE is in the markers folder, or
            the rank is asked to stop (SIGTERM), then goes on: a gate that keeps the run at a known place while a
            test acts on it (the save's allowance, not --stall-timeout, bounds it).

Its peers then wait in the step's first collective, which only --collective-timeout would end, if ever.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from training.spec import RUN_DIR_ENV

HANG_ENV = "TRAINKIT_TEST_HANG"
TIME_SCALE_ENV = "TRAINKIT_TEST_TIME_SCALE"
"""How many of the stall watchdog's seconds one second counts for (trainkit/run/agent.py make_watchdog): a test runs
a 20-minute checkpoint in 12 s at 100."""
MARKERS_ENV = "TRAINKIT_TEST_HANG_MARKERS"
"""A folder every node of the run reaches, for the markers, where the run folder is not shared."""
SLOW_SAVE_ENV = "TRAINKIT_TEST_SLOW_SAVE_S"
RELEASE_FILE = "release"
KINDS = {
    "sigstop": "step",
    "sleep": "step",
    "deadlock": "step",
    "data": "data",
    "slowsave": "checkpoint",
    "hold": "checkpoint",
}
"""Each kind and the point of the step where it strikes."""


def _entries() -> list[tuple[str, int, int, int]]:
    found = []
    for entry in filter(None, os.environ.get(HANG_ENV, "").split(",")):
        kind, _, place = entry.partition("@")
        place, _, times = place.partition("*")
        rank, step = (int(part) for part in place.split(":"))
        if kind not in KINDS:
            raise ValueError(f"{HANG_ENV}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
        found.append((kind, rank, step, int(times or 1)))
    return found


def markers_folder() -> Path:
    shared = os.environ.get(MARKERS_ENV)
    return Path(shared) if shared else Path(os.environ.get(RUN_DIR_ENV, ".")) / ".test-faults"


def _strikes(entry: str, times: int) -> bool:
    """Whether this entry strikes now: the first rank to get here takes one of its `times` markers."""
    folder = markers_folder()
    folder.mkdir(parents=True, exist_ok=True)
    for strike in range(times):
        try:
            os.close(os.open(folder / (entry if strike == 0 else f"{entry}#{strike + 1}"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        return True
    return False


def hang_here(point: str, step: int, stopping=lambda: False) -> None:
    """Hang as an entry of HANG_ENV says, if one names this rank, `step` and `point` and has not struck yet;
    `stopping()` says whether the rank was asked to stop (it ends a hold)."""
    if HANG_ENV not in os.environ:
        return
    rank = int(os.environ.get("RANK", 0))
    for kind, at_rank, at_step, times in _entries():
        if (KINDS[kind], at_rank, at_step) != (point, rank, step) or not _strikes(f"{kind}@{rank}:{step}", times):
            continue
        print(f"rank {rank}: test fault: {kind} at step {step}", flush=True)
        if kind == "slowsave":
            time.sleep(float(os.environ.get(SLOW_SAVE_ENV) or 10))
            return
        if kind == "hold":
            while not (markers_folder() / RELEASE_FILE).exists() and not stopping():
                time.sleep(0.1)
            return
        if kind == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif kind == "deadlock":
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()
        while True:  # sleep, data (and a sigstop resumed by hand)
            time.sleep(3600)
