"""Publishing files that several processes (or pods on one shared volume) may write at once."""

from __future__ import annotations

import os
import socket
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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_sibling(path)
    try:
        with tmp.open("w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full volume: no half-written sibling left behind
        raise
    fsync_dir(path.parent)
    return path
