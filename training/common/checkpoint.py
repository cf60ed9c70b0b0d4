"""Checkpoints that publish atomically: write aside, mark complete, rename, then move `latest`.

Layout under `checkpoints/`:

    .tmp-step-00000040/     being written by all ranks; never read
    step-00000040/          published: every shard plus `trainer_state.json` and `COMPLETE`
    latest                  text file naming the newest published step directory

A process killed at any moment leaves either the previous `latest` or the new one, never a
half-written directory under a published name. Before the marker is written one rank per machine
fsyncs the files it can see under the new directory and the main rank records each file's size in
`MANIFEST.json` and fsyncs the folders, so a power loss cannot leave a marker over missing data. On
start, leftover `.tmp-*` directories are removed and `latest` is checked; if it names a directory
that is missing or incomplete, the newest complete step directory is used instead. A published
checkpoint that does not match its manifest or does not load is set aside as `corrupt-step-*` (kept as
evidence, never read again) and the next older one is tried (training/common/run.py, resume).

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

from .files import fsync_dir, publish_text

CHECKPOINTS_DIR = "checkpoints"
"""Under the run directory."""
COMPLETE_MARKER = "COMPLETE"
STATE_FILE = "trainer_state.json"
MANIFEST = "MANIFEST.json"
LATEST = "latest"
SET_ASIDE_PREFIX = "corrupt-"
# Fault injection for tests and `invoke chaos`: seconds to pause after the shards are written and
# before the checkpoint is published, so a kill can land inside the write.
STALL_ENV = "TRAINKIT_CHECKPOINT_STALL_S"


def _fsync_tree(root: Path) -> None:
    """fsync every file and folder under `root`: the shards this machine's ranks wrote reach the disk before the
    marker."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    for folder in sorted({p.parent for p in root.rglob("*")} | {root}):
        fsync_dir(folder)


def manifest_of(directory: Path) -> dict[str, int]:
    """{relative path: size} of every file of a checkpoint but its own bookkeeping files."""
    skip = {COMPLETE_MARKER, STATE_FILE, MANIFEST}
    return {
        str(p.relative_to(directory)): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name not in skip
    }


def check_manifest(directory: Path) -> str | None:
    """Why the files of a published checkpoint differ from what was written (None: they match, or a
    checkpoint from before manifests)."""
    recorded_file = directory / MANIFEST
    if not recorded_file.is_file():
        return None
    recorded, found = json.loads(recorded_file.read_text()), manifest_of(directory)
    missing = sorted(set(recorded) - set(found))
    if missing:
        return f"{len(missing)} file(s) missing, e.g. {missing[0]}"
    changed = sorted(name for name, size in recorded.items() if found[name] != size)
    if changed:
        name = changed[0]
        return f"{len(changed)} file(s) of the wrong size, e.g. {name} ({found[name]} bytes, written {recorded[name]})"
    return None


def complete_steps(root: Path) -> list[Path]:
    """The published checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if p.is_dir() and (p / COMPLETE_MARKER).is_file()]
    return sorted(found, key=lambda p: p.name)


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def remove_partial(root: Path) -> list[Path]:
    """Remove the temporary folders of saves that never published under `root` (a checkpoints folder); returns
    what was removed. Only when no rank can still be writing into them: at a start (clean_partial), or by the
    launcher once every process of a failed run has exited (a full volume then gets its space back at once)."""
    removed = []
    if root.is_dir():
        for leftover in sorted(root.glob(".tmp-step-*")):
            shutil.rmtree(leftover, ignore_errors=True)
            removed.append(leftover)
    return removed


class CheckpointManager:
    def __init__(
        self, root: Path, keep: int, is_main: bool, barrier: Callable[[], None], is_local_main: bool | None = None
    ):
        """`is_local_main`: this rank syncs the node's writes to disk (one rank per machine; the page cache is
        the machine's); defaults to `is_main` (one machine)."""
        self.root = Path(root)
        self.keep = keep
        self.is_main = is_main
        self.is_local_main = is_main if is_local_main is None else is_local_main
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
        if self.is_main:
            remove_partial(self.root)
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
        if self.is_local_main:  # one rank per machine: what its ranks wrote is on disk before anything is published
            _fsync_tree(tmp)
        self.barrier()
        stall = float(os.environ.get(STALL_ENV, "0") or 0)
        if stall > 0:
            time.sleep(stall)
        if self.is_main:
            publish_text(tmp / MANIFEST, json.dumps(manifest_of(tmp), indent=1) + "\n")
            publish_text(tmp / STATE_FILE, json.dumps(dict(state, step=step), indent=2) + "\n")
            publish_text(tmp / COMPLETE_MARKER, f"{step}\n")
            if final.exists():  # a re-run of the same step after a crash between rename and `latest`
                shutil.rmtree(final)
            tmp.rename(final)
            fsync_dir(self.root)
            publish_text(self.root / LATEST, final.name + "\n")
            self._prune()
        self.barrier()
        return final

    def set_aside(self, checkpoint: Path, reason: str) -> Path:
        """Rename a published checkpoint that cannot be used to `corrupt-<name>` (main rank), with why, and point
        `latest` at the newest one left. Nothing is deleted: it is evidence."""
        target = self.root / f"{SET_ASIDE_PREFIX}{checkpoint.name}"
        if self.is_main:
            if target.exists():
                shutil.rmtree(target)
            checkpoint.rename(target)
            publish_text(target / "REJECTED", reason + "\n")
            remaining = self._complete_steps()
            if remaining:
                publish_text(self.root / LATEST, remaining[-1].name + "\n")
            else:
                (self.root / LATEST).unlink(missing_ok=True)
            fsync_dir(self.root)
        self.barrier()
        return target

    def _prune(self) -> None:
        for old in self._complete_steps()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
