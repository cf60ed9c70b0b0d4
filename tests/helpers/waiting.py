"""Waiting for something a background job does."""

from __future__ import annotations

import time
from pathlib import Path


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def latest_step(run_dir: Path) -> int:
    """The step of the run's latest published checkpoint (0: none yet)."""
    pointer = run_dir / "checkpoints" / "latest"
    return int(pointer.read_text().strip().split("-")[1]) if pointer.exists() else 0
