"""Each rank's heartbeat: where the rank is (the last step it finished, and what it is doing now), for the stall
watchdog in its torchrun agent (trainkit/run/watchdog.py), which runs outside the rank and so still acts when the
rank's own code cannot (blocked in a collective, a data read, a deadlock).

The agent names a node-local folder in TRAINKIT_HEARTBEAT_DIR; each rank keeps one small file there, `rank-<RANK>`,
replaced whole at every beat (a rename: the agent never reads half a beat). The file holds JSON:

    {"step": 42, "phase": "step", "time": 1795736860.5, "monotonic": 81234.5, "median_s": 0.31, "timed": 40,
     "pid": 1234, "thread": 140234..., "dumps": true}

`step`: the last optimizer step finished; `monotonic`: when, on the node's monotonic clock (CLOCK_MONOTONIC, one
for every process of the host), which the watchdog measures with: a step of the wall clock (`time`, for people)
never makes a healthy rank look late; `median_s` and `timed`: the median of the rank's own step times in this
process and how many steps it timed (only steps: a checkpoint between two beats is not counted); `phase`: what the
rank does now: `step` (training the next one),
`checkpoint`, `evaluate` or `export` (after the last step: the final save and the model's export): work that may
take far longer than a step, which the watchdog allows more for;
`thread`: the main thread's id, whose stack the watchdog reads from a dump; `dumps`: the rank registered
DUMP_SIGNAL to dump every thread's stack to its log (faulthandler: it writes from the signal handler, so the dump
comes even while the main thread is blocked inside a C call).

A user's script beats through `training.script.report_step` (one call per step) and marks its own slow work with
`training.script.phase("checkpoint")` (training/lightning.py does both for a Lightning Trainer), or beats with a
file of its own: any process may write the step number, alone, into `$TRAINKIT_HEARTBEAT_DIR/rank-$RANK`
(docs/checkpoints.md).
Outside a trainkit job (no TRAINKIT_HEARTBEAT_DIR) a beat does nothing.
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import json
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

HEARTBEAT_DIR_ENV = "TRAINKIT_HEARTBEAT_DIR"
DUMP_SIGNAL = signal.SIGUSR2
"""Not SIGUSR1: Lightning's SLURM support and other schedulers' tools use that one for their own requests."""
PHASES = ("step", "checkpoint", "evaluate", "export")
"""What a rank may be doing; every phase but `step` gets the watchdog's longer allowance."""
SLOW_PHASES = tuple(phase for phase in PHASES if phase != "step")


def beat_file(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"rank-{rank}"


class Heartbeat:
    """One rank's heartbeat file (a no-op outside a trainkit job)."""

    def __init__(self, directory: str | None = None, rank: int | None = None):
        directory = directory if directory is not None else os.environ.get(HEARTBEAT_DIR_ENV)
        rank = rank if rank is not None else int(os.environ.get("RANK", 0))
        self.path = beat_file(directory, rank) if directory else None
        self.step = 0
        self.current = "step"
        self.dumps = False
        self.since: float | None = None  # when the current run of steps began (its first beat in phase `step`)
        self.durations: collections.deque = collections.deque(maxlen=100)
        self.timed = 0

    def arm(self) -> Heartbeat:
        """Let the watchdog ask for this process's stacks: DUMP_SIGNAL writes every thread's to stderr (the rank's
        log), then calls a handler registered before, if any."""
        if self.path is not None and not self.dumps:
            with contextlib.suppress(AttributeError, ValueError, OSError, RuntimeError):
                # Chained only to a handler the process installed: chaining to the default action would end it.
                previous = signal.getsignal(DUMP_SIGNAL)
                chain = previous not in (signal.SIG_DFL, signal.SIG_IGN, None)
                faulthandler.register(DUMP_SIGNAL, file=sys.stderr, all_threads=True, chain=chain)
                self.dumps = True
        return self

    def beat(self, step: int, phase: str = "step") -> None:
        """Step `step` is finished and the rank is now in `phase`."""
        now = time.monotonic()
        if phase == self.current == "step" and self.since is not None and step > self.step:
            # the rank's own step times (a checkpoint or an evaluation between two beats is not one)
            self.durations.append((now - self.since) / (step - self.step))
            self.timed += step - self.step
        self.since = now if phase == "step" else None
        self.step, self.current = int(step), phase
        if self.path is None:
            return
        record = {
            "step": self.step,
            "phase": phase,
            "time": time.time(),
            "monotonic": now,
            "median_s": statistics.median(self.durations) if self.durations else None,
            "timed": self.timed,
            "pid": os.getpid(),
            "thread": threading.main_thread().ident,
            "dumps": self.dumps,
        }
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        with contextlib.suppress(OSError):  # a lost beat is a late beat, never the rank's failure
            partial.write_text(json.dumps(record))
            os.replace(partial, self.path)

    def enter(self, name: str) -> str:
        """Start work other than a step (one of SLOW_PHASES); returns what the rank did before, for `beat` after it.
        Where the end of that work has no place of its own (a framework's hook), the next step's beat ends it."""
        if name not in SLOW_PHASES:
            raise ValueError(f"phase {name!r}: one of {', '.join(SLOW_PHASES)}")
        before = self.current
        self.beat(self.step, name)
        return before

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Work other than a step (a checkpoint, an evaluation): the watchdog gives it the longer allowance; after
        it the rank is back to what it did before."""
        before = self.enter(name)
        try:
            yield
        finally:
            self.beat(self.step, before)


_process: Heartbeat | None = None


def process_heartbeat() -> Heartbeat:
    """This process's heartbeat, armed at first use."""
    global _process
    if _process is None:
        _process = Heartbeat().arm()
    return _process
