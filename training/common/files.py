"""Publishing files that several processes (or pods on one shared volume) may write at once."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path


def tmp_sibling(path: Path) -> Path:
    """A private name beside `path`: host and a random part, since pids repeat across containers."""
    return path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{uuid.uuid4().hex[:8]}")


def publish_text(path: Path, text: str) -> Path:
    """Write `text` to `path` atomically: readers see the old file or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_sibling(path)
    tmp.write_text(text)
    tmp.replace(path)
    return path
