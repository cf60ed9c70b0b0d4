"""Small real volumes for the tests of what a full disk does (a tmpfs the test mounts; CI runs as root)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_volume(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` at `path`, unmounted after (lazily: a process that still holds a file must not fail it)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
