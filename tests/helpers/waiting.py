"""Waiting for something a background job or server does."""

from __future__ import annotations

import subprocess
import time
import urllib.request
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


def wait_until_serving(url: str, server: subprocess.Popen, failure: str, timeout: float) -> None:
    """Poll `url` until the server answers; fail at once if the server process has exited."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise AssertionError(failure) from None
            time.sleep(0.2)
