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

Hosts that share no filesystem (a SageMaker job: each host syncs its own checkpoint folder to one S3 prefix, and
a job's start restores the union onto every host; trainkit/backends/sagemaker/README.md) publish per host: HOST_ENV
names this host and HOSTS_ENV all of them. A step is complete where `HOSTS` is and every host it names has its marker
`COMPLETE.<host>` and a manifest `MANIFEST.<host>.json` that matches the files (names no other host writes, so the
union keeps every host's): that is, in the union a job's start restores. SageMaker's sync mirrors the folder file by
file, deletions included (Developer Guide, "Checkpoints in Amazon SageMaker AI": "If a checkpoint is deleted in the
SageMaker AI container, it will also be deleted in the S3 folder"), and no page says what it makes of a rename, so:

- nothing is renamed: this host's ranks write straight into `step-N/`, then its local main rank writes the host's
  manifest (what its ranks wrote there, and nothing another host's part brought), the main rank `trainer_state.json`
  and `HOSTS`, and the host's marker last; after a barrier that every host has, the main rank writes `latest`;
- a host deletes only its own part (its marker first): when it prunes, or writes a step again. After a restore every
  host holds every host's files, under keys all hosts share, and another host's may be newer in S3 than here;
- resume takes the newest complete step here, not `latest`: another host's copy of `latest` is the one the job's
  start restored.

Within one job no host holds the others' parts: before its workers restart in place, each host fetches them from S3
(trainkit/backends/sagemaker/restore.py), and the next job, or a spot restart, resumes from the union.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from .files import fsync_dir, publish_text

CHECKPOINTS_DIR = "checkpoints"
"""Under the run directory."""
COMPLETE_MARKER = "COMPLETE"
STATE_FILE = "trainer_state.json"
MANIFEST = "MANIFEST.json"
LATEST = "latest"
SET_ASIDE_PREFIX = "corrupt-"
HOSTS_FILE = "HOSTS"
HOST_ENV = "TRAINKIT_CHECKPOINT_HOST"
HOSTS_ENV = "TRAINKIT_CHECKPOINT_HOSTS"
"""This host's name and all the job's hosts (comma-separated), where the hosts share no filesystem."""
# Fault injection for tests and `invoke chaos`: seconds to pause after the shards are written and
# before the checkpoint is published, so a kill can land inside the write.
STALL_ENV = "TRAINKIT_CHECKPOINT_STALL_S"
SYNC_MARKER_SUFFIXES = (".sagemaker-uploading", ".sagemaker-uploaded")
"""Files SageMaker's agent may leave beside one it uploads (AWS's sagemaker-xgboost-container, checkpointing.py, waits
on them; the Developer Guide does not name them): no part of what a host wrote."""


def _fsync_tree(root: Path, names: Iterable[str] | None = None) -> None:
    """fsync the files under `root` (`names`: only these) and their folders: what this machine's ranks wrote reaches
    the disk before the marker."""
    paths = sorted(root.rglob("*")) if names is None else [root / name for name in sorted(names)]
    for path in paths:
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    for folder in sorted({p.parent for p in paths} | {root}):
        fsync_dir(folder)


def _signatures(folder: Path) -> dict[str, tuple[int, int, int]]:
    """{path relative to `folder`: (inode, mtime ns, size)} of the files under it."""
    found = {}
    for path in folder.rglob("*"):
        if path.is_file():
            stat = path.stat()
            found[str(path.relative_to(folder))] = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    return found


def _write_in_place(path: Path, text: str) -> None:
    """`text` under `path`'s own name, on disk when this returns: per host, where a rename is not known to reach S3 as
    one. A reader never takes it half-written: it counts only with the marker, written after it."""
    with path.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _stall() -> None:
    stall = float(os.environ.get(STALL_ENV, "0") or 0)
    if stall > 0:
        time.sleep(stall)


def _no_part(name: str) -> bool:
    """A file in a step folder that is no host's data: the step's bookkeeping, or the sync's own markers."""
    return is_bookkeeping(Path(name).name) or name.endswith(SYNC_MARKER_SUFFIXES)


def host_marker(host: str) -> str:
    return f"{COMPLETE_MARKER}.{host}"


def host_manifest(host: str) -> str:
    return f"MANIFEST.{host}.json"


def is_bookkeeping(name: str) -> bool:
    """A checkpoint's own bookkeeping file (its markers, manifests, trainer state, HOSTS), not data it holds."""
    return name in (COMPLETE_MARKER, STATE_FILE, MANIFEST, HOSTS_FILE) or (
        name.startswith(f"{COMPLETE_MARKER}.") or (name.startswith("MANIFEST.") and name.endswith(".json"))
    )


def manifest_of(directory: Path) -> dict[str, int]:
    """{relative path: size} of every file of a checkpoint but its own bookkeeping files."""
    return {
        str(p.relative_to(directory)): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not is_bookkeeping(p.name)
    }


def step_hosts(directory: Path) -> list[str] | None:
    """The hosts a per-host checkpoint was written by (its HOSTS file), or None for one written on one filesystem."""
    path = directory / HOSTS_FILE
    return path.read_text().split() if path.is_file() else None


def is_complete(directory: Path) -> bool:
    """Published: its marker, or (per host) every host's marker."""
    hosts = step_hosts(directory)
    if hosts is None:
        return (directory / COMPLETE_MARKER).is_file()
    return all((directory / host_marker(host)).is_file() for host in hosts)


def check_manifest(directory: Path) -> str | None:
    """Why the files of a published checkpoint differ from what was written (None: they match, or a
    checkpoint from before manifests). Per host: every host's manifest against the files of the union."""
    hosts = step_hosts(directory)
    if hosts is not None:
        missing = [host for host in hosts if not (directory / host_manifest(host)).is_file()]
        if missing:
            return f"host {missing[0]}'s part never arrived (no {host_manifest(missing[0])})"
        recorded = {}
        for host in hosts:
            recorded |= json.loads((directory / host_manifest(host)).read_text())
        return _compare(recorded, manifest_of(directory))
    recorded_file = directory / MANIFEST
    if not recorded_file.is_file():
        return None
    return _compare(json.loads(recorded_file.read_text()), manifest_of(directory))


def _compare(recorded: dict[str, int], found: dict[str, int]) -> str | None:
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
    found = [p for p in root.glob("step-*") if p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: p.name)


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def step_of_dir(name: str) -> int:
    """The step of a checkpoint folder named by step_dir_name."""
    return int(name.removeprefix("step-"))


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


def owns_disk(host: str | None, is_main: bool, is_local_main: bool) -> bool:
    """Whether this rank does what is done once per disk (remove leftovers, set aside, convert): each host's local main
    where each host has its own (`host`: HOST_ENV), else the main rank."""
    return is_local_main if host else is_main


def this_rank_owns_disk(rank: int) -> bool:
    """`owns_disk` for this process, from what torchrun and the launcher tell it (HOST_ENV, LOCAL_RANK)."""
    return owns_disk(os.environ.get(HOST_ENV), rank == 0, int(os.environ.get("LOCAL_RANK", rank)) == 0)


class CheckpointManager:
    def __init__(
        self,
        root: Path,
        keep: int,
        is_main: bool,
        barrier: Callable[[], None],
        is_local_main: bool | None = None,
        host: str | None = None,
        hosts: tuple[str, ...] = (),
    ):
        """`is_local_main`: this rank syncs the node's writes to disk (one rank per machine; the page cache is
        the machine's); defaults to `is_main` (one machine). `host`, `hosts`: this host and all of them, where
        the hosts share no filesystem (per-host publishing, see the module's docstring); default from HOST_ENV and
        HOSTS_ENV."""
        self.root = Path(root)
        self.keep = keep
        self.is_main = is_main
        self.is_local_main = is_main if is_local_main is None else is_local_main
        self.barrier = barrier
        self.host = host if host is not None else os.environ.get(HOST_ENV) or None
        self.hosts = hosts or tuple(h for h in os.environ.get(HOSTS_ENV, "").split(",") if h)
        self.disk_owner = owns_disk(self.host, self.is_main, self.is_local_main)
        self.protected: set[str] = set()
        """Step folders the pruning keeps whatever their age (the best evaluation's checkpoint, --keep-best)."""

    # ------------------------------------------------------------------ reading

    def _complete_steps(self) -> list[Path]:
        return complete_steps(self.root)

    def latest(self) -> Path | None:
        """The checkpoint to resume from, or None for a fresh start. Per host the newest complete one: `latest` is the
        main rank's, and another host's copy of it is what the job's start restored."""
        pointer = self.root / LATEST
        if pointer.is_file() and not self.host:
            candidate = self.root / pointer.read_text().strip()
            if is_complete(candidate):
                return candidate
        complete = self._complete_steps()
        return complete[-1] if complete else None

    @staticmethod
    def read_state(checkpoint: Path) -> dict:
        return json.loads((checkpoint / STATE_FILE).read_text())

    # ------------------------------------------------------------------ writing

    def clean_partial(self) -> None:
        """Remove directories left by a save that never published (call once at start, all ranks)."""
        if self.disk_owner:
            remove_partial(self.root)
        self.barrier()

    def save(self, step: int, write_fn: Callable[[Path], None], state: dict) -> Path:
        """Write on every rank into a temporary directory, then publish from the main rank (per host: see
        `_save_per_host`)."""
        if self.host:
            return self._save_per_host(step, write_fn, state)
        tmp = self.root / f".tmp-{step_dir_name(step)}"
        final = self.root / step_dir_name(step)
        if self.disk_owner:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.barrier()
        write_fn(tmp)
        self.barrier()
        if self.is_local_main:  # one rank per machine: what its ranks wrote is on disk before anything is published
            _fsync_tree(tmp)
        self.barrier()
        _stall()
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

    def _save_per_host(self, step: int, write_fn: Callable[[Path], None], state: dict) -> Path:
        """Per host, with no rename (see the module's docstring): this host's ranks write into `step-N/` itself, then
        its local main rank writes what they wrote into the host's manifest, the main rank the trainer state and
        `HOSTS`, and the host's marker comes last; `latest` once every host has its marker."""
        final = self.root / step_dir_name(step)
        before, written = {}, {}
        if self.is_local_main:
            for later in self._own_steps():  # a timeline the run went back from (a resume before them): not kept,
                if step_of_dir(later.name) > step:  # nor counted by the prune below as newer than this step
                    self._withdraw(later)
            self._withdraw(final)  # the step written again: this host's earlier part no longer counts
            final.mkdir(parents=True, exist_ok=True)
            before = _signatures(final)  # another host's part, restored here, is no part of this host's
        self.barrier()
        write_fn(final)
        self.barrier()
        if self.is_local_main:
            found = _signatures(final).items()
            written = {name: sig for name, sig in found if before.get(name) != sig and not _no_part(name)}
            _fsync_tree(final, written)
        self.barrier()
        _stall()
        if self.is_local_main:
            sizes = {name: signature[2] for name, signature in sorted(written.items())}
            _write_in_place(final / host_manifest(self.host), json.dumps(sizes, indent=1) + "\n")
            if self.is_main:
                _write_in_place(final / STATE_FILE, json.dumps(dict(state, step=step), indent=2) + "\n")
                _write_in_place(final / HOSTS_FILE, "\n".join(self.hosts) + "\n")
            fsync_dir(final)
            _write_in_place(final / host_marker(self.host), f"{step}\n")
            fsync_dir(final)
            fsync_dir(self.root)
        self.barrier()
        if self.is_main:
            _write_in_place(self.root / LATEST, final.name + "\n")
        if self.is_local_main:
            self._prune()
        self.barrier()
        return final

    def _own_steps(self) -> list[Path]:
        """The steps this host has its marker in, oldest first."""
        return sorted(p for p in self.root.glob("step-*") if (p / host_marker(self.host)).is_file())

    def _withdraw(self, directory: Path) -> None:
        """Delete this host's part of a step: its marker first (the step no longer counts), the files its manifest
        lists, the manifest; the main rank's part holds the trainer state and `HOSTS` too. Never another host's
        files: where a deletion here is one in S3, their keys may hold what that host wrote since the restore."""
        manifest = directory / host_manifest(self.host)
        (directory / host_marker(self.host)).unlink(missing_ok=True)
        try:
            names = list(json.loads(manifest.read_text()))
        except (OSError, ValueError):  # none, or cut short by a crash before this host's marker
            names = []
        names += [host_manifest(self.host)] + ([STATE_FILE, HOSTS_FILE] if self.is_main else [])
        for name in names:
            (directory / name).unlink(missing_ok=True)
        for folder in sorted((p for p in directory.rglob("*") if p.is_dir()), reverse=True) + [directory]:
            with contextlib.suppress(OSError):  # not empty: another host's files are still in it
                folder.rmdir()

    def set_aside(self, checkpoint: Path, reason: str) -> Path:
        """Rename a published checkpoint that cannot be used to `corrupt-<name>` (main rank), with why, and point
        `latest` at the newest one left. Nothing is deleted: it is evidence."""
        target = self.root / f"{SET_ASIDE_PREFIX}{checkpoint.name}"
        if self.disk_owner:  # per host: every host holds the union it was restored from
            if target.exists():
                shutil.rmtree(target)
            checkpoint.rename(target)
            publish_text(target / "REJECTED", reason + "\n")
            remaining = self._complete_steps()
            if not remaining:
                (self.root / LATEST).unlink(missing_ok=True)
            elif self.is_main or not self.host:
                publish_text(self.root / LATEST, remaining[-1].name + "\n")
            fsync_dir(self.root)
        self.barrier()
        return target

    def _prune(self) -> None:
        """Keep the newest `keep` published steps on this disk, and the `protected` ones. Per host: this host's parts of
        the steps it published but the newest `keep`; the other hosts' files of them that a restore brought stay
        on this disk (their own hosts delete them in S3), costing disk until the job ends, not correctness."""
        if self.host:
            for old in self._own_steps()[: -self.keep]:
                if old.name not in self.protected:
                    self._withdraw(old)
            return
        for old in self._complete_steps()[: -self.keep]:
            if old.name not in self.protected:
                shutil.rmtree(old, ignore_errors=True)
