"""Checkpoints that publish atomically: write aside, mark complete, rename, then move `latest`.

Layout under `checkpoints/`:

    .tmp-step-00000040/     being written by all ranks; never read
    step-00000040/          published: every shard plus `trainer_state.json` and `COMPLETE`
    latest                  text file naming the newest published step directory

A process killed at any moment leaves either the previous `latest` or the new one, never a
half-written directory under a published name. On start, leftover `.tmp-*` directories are removed
and `latest` is checked; if it names a directory that is missing or incomplete, the newest complete
step directory is used instead.

Works for any writer: `save(step, write_fn, state)` calls `write_fn(tmp_dir)` on every rank (e.g.
Accelerate's sharded `save_state`), with barriers around it supplied by the caller.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

CHECKPOINTS_DIR = "checkpoints"
"""Under the run directory."""
COMPLETE_MARKER = "COMPLETE"
STATE_FILE = "trainer_state.json"
LATEST = "latest"
# Fault injection for tests and `invoke chaos`: seconds to pause after the shards are written and
# before the checkpoint is published, so a kill can land inside the write.
STALL_ENV = "TRAINKIT_CHECKPOINT_STALL_S"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)
    _fsync_dir(path.parent)


def complete_steps(root: Path) -> list[Path]:
    """The published checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if p.is_dir() and (p / COMPLETE_MARKER).is_file()]
    return sorted(found, key=lambda p: p.name)


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


class CheckpointManager:
    def __init__(self, root: Path, keep: int, is_main: bool, barrier: Callable[[], None]):
        self.root = Path(root)
        self.keep = keep
        self.is_main = is_main
        self.barrier = barrier

    # ------------------------------------------------------------------ reading

    def _complete_steps(self) -> list[Path]:
        return complete_steps(self.root)

    def latest(self) -> Path | None:
        """The checkpoint to resume from, or None for a fresh start."""
        pointer = self.root / LATEST
        if pointer.is_file():
            candidate = self.root / pointer.read_text().strip()
            if (candidate / COMPLETE_MARKER).is_file():
                return candidate
        complete = self._complete_steps()
        return complete[-1] if complete else None

    @staticmethod
    def read_state(checkpoint: Path) -> dict:
        return json.loads((checkpoint / STATE_FILE).read_text())

    # ------------------------------------------------------------------ writing

    def clean_partial(self) -> None:
        """Remove directories left by a save that never published (call once at start, all ranks)."""
        if self.is_main and self.root.is_dir():
            for leftover in self.root.glob(".tmp-step-*"):
                shutil.rmtree(leftover, ignore_errors=True)
        self.barrier()

    def save(self, step: int, write_fn: Callable[[Path], None], state: dict) -> Path:
        """Write on every rank into a temporary directory, then publish from the main rank."""
        tmp = self.root / f".tmp-{step_dir_name(step)}"
        final = self.root / step_dir_name(step)
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.barrier()
        write_fn(tmp)
        self.barrier()
        stall = float(os.environ.get(STALL_ENV, "0") or 0)
        if stall > 0:
            time.sleep(stall)
        if self.is_main:
            _write_durable(tmp / STATE_FILE, json.dumps(dict(state, step=step), indent=2) + "\n")
            _write_durable(tmp / COMPLETE_MARKER, f"{step}\n")
            if final.exists():  # a re-run of the same step after a crash between rename and `latest`
                shutil.rmtree(final)
            tmp.rename(final)
            _fsync_dir(self.root)
            _write_durable(self.root / LATEST, final.name + "\n")
            self._prune()
        self.barrier()
        return final

    def _prune(self) -> None:
        for old in self._complete_steps()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
