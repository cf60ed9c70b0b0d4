"""Publishing files that several processes (or pods on one shared volume) may write at once."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path


def tmp_sibling(path: Path) -> Path:
    """A private name beside `path`: host and a random part, since pids repeat across containers."""
    return path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{uuid.uuid4().hex[:8]}")


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable (the directory's own metadata)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def publish_text(path: Path, text: str) -> Path:
    """Write `text` to `path` atomically and durably: readers see the old file or the whole new one, never
    a part, and once this returns the new one survives the machine (or the pod) going away."""
    return publish_bytes(path, text.encode())


def publish_bytes(path: Path, data: bytes) -> Path:
    """publish_text for bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_sibling(path)
    try:
        with tmp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full volume: no half-written sibling left behind
        raise
    fsync_dir(path.parent)
    return path


EVENTS_FILE = "events.jsonl"


def append_event(run_dir: Path, kind: str, **fields) -> None:
    """One line of the run's events.jsonl ({"event": kind, "time": ..., **fields}), on disk when this returns. Its
    writers (rank 0, the launcher, a node's agent) each append whole lines."""
    with (run_dir / EVENTS_FILE).open("a") as handle:
        handle.write(json.dumps({"event": kind, "time": time.time(), **fields}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def publish_rank_files(run_dir: Path, rank: int, files: dict[str, str]) -> None:
    """logs/ranks/<rank>.json: {"stdout": path, "stderr": path} of a global rank's current process, written by the
    torchrun agent that started it (trainkit/run/agent.py), for any workload, when it starts the rank."""
    from .job import RANK_LOGS_DIR

    folder = run_dir / "logs" / RANK_LOGS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    publish_text(folder / f"{rank}.json", json.dumps(files) + "\n")
