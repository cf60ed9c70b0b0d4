"""Long set-ups started in the background early in the session, so they run beside the rest of the suite.

Some pieces of the suite spend minutes in set-up that leaves CPU idle for long stretches: the chaos matrix
(`invoke bench elastic`: process start-ups, rendezvous waits), the training image (debootstrap and pip
downloads, buildah's layer copies) and the `invoke bench train` pair (process start-ups). When collection has
selected the module that reads one, tests/conftest.py starts it with the first test outside the unit layer and
orders that module's tests last; its fixture then waits for the result. Nothing asserted on is a wall time:
each piece keeps its own timeouts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tests.helpers.paths import REPO


class Background:
    """One command, started now in a session of its own, its output in files under `root`."""

    def __init__(self, name: str, command: list[str], timeout_s: float, env: dict | None = None):
        self.name = name
        self.root = Path(tempfile.mkdtemp(prefix=f"trainkit-{name}-"))
        self.timeout_s = timeout_s
        self.stdout, self.stderr = self.root / "stdout.log", self.root / "stderr.log"
        self.command = [part.replace("{root}", str(self.root)) for part in command]
        with self.stdout.open("w") as out, self.stderr.open("w") as err:
            self.process = subprocess.Popen(
                self.command, cwd=REPO, env=env, stdout=out, stderr=err, start_new_session=True
            )
        self.started = time.monotonic()
        self.seconds: float | None = None  # how long the command ran, once it has ended
        threading.Thread(target=self._time, daemon=True).start()

    def _time(self) -> None:
        self.process.wait()
        self.seconds = time.monotonic() - self.started

    def result(self) -> subprocess.CompletedProcess:
        """Wait for the command (up to its timeout from the start) and give what it did."""
        left = max(1.0, self.timeout_s - (time.monotonic() - self.started))
        try:
            self.process.wait(timeout=left)
        except subprocess.TimeoutExpired:
            self.stop()
        return subprocess.CompletedProcess(
            self.command, self.process.returncode, self.stdout.read_text(), self.stderr.read_text()
        )

    def stop(self) -> None:
        """Interrupt it if still running (Ctrl-C first: the commands stop their own jobs; then SIGTERM, as a
        suite run in the background of a script has SIGINT ignored, and `invoke bench` ends its runs on either),
        then kill."""
        for sig, wait_s in ((signal.SIGINT, 5), (signal.SIGTERM, 55)):
            if self.process.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=wait_s)
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
