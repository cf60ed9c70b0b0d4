"""What every local server shares: free ports, health checks, starting a server with its log, and the
background-server base class the local profile's servers (`make up` / `make down`) derive from."""

from __future__ import annotations

import abc
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from trainkit.paths import make_folder, state_dir


def free_port_pair() -> int:
    """A port p on 127.0.0.1 with p and p + 1 both free."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free pair of ports on 127.0.0.1")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def launch(command: list[str], log_path: Path, ready, what: str, timeout: float, detach: bool) -> subprocess.Popen:
    """Start a server with its output appended to `log_path`; return once `ready()` holds, or raise
    (naming the log) if it exits or `timeout` passes first."""
    with log_path.open("a") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=detach)
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start; see {log_path}")
        time.sleep(0.1)
    return process


def terminate(process: subprocess.Popen | None) -> None:
    """SIGTERM, then SIGKILL after 30 s; returns once it has exited."""
    if process and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class OwnedServer(abc.ABC):
    """A server its caller starts and stops (tests, the chaos harness), usable as a context manager."""

    process: subprocess.Popen | None = None

    @abc.abstractmethod
    def start(self, timeout: float = 30) -> OwnedServer:
        """Start it and return once it answers."""

    def stop(self) -> None:
        terminate(self.process)

    def __enter__(self):
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()


class Background(abc.ABC):
    """A server the local profile runs in the background: pid and endpoint files under
    `.trainkit/<name>/`; `_pid()` only trusts a pid whose command line is still ours."""

    name = ""  # folder under .trainkit/
    binary = ""  # start of the server's argv[0]
    health_path = ""  # answers 200 when the server is up

    def __init__(self, root: Path | None = None):
        self.root = (root or state_dir()) / self.name
        self.pid_file, self.endpoint_file = self.root / "pid", self.root / "endpoint"

    def _pid(self) -> int | None:
        """The recorded pid, if that process is still our server (not a reused pid)."""
        try:
            pid = int(self.pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        ours = cmdline and Path(cmdline[0].decode()).name.startswith(self.binary)
        return pid if ours and str(self.root).encode() in b" ".join(cmdline) else None

    def _healthy(self, endpoint: str) -> bool:
        return http_ok(f"http://{endpoint}{self.health_path}")

    def endpoint(self) -> str | None:
        """host:port of the running server, or None."""
        if self._pid() is None or not self.endpoint_file.exists():
            return None
        endpoint = self.endpoint_file.read_text().strip()
        return endpoint if self._healthy(endpoint) else None

    removed_on_down = ""  # a sub-folder `down()` deletes (state that must not outlive the server)

    @abc.abstractmethod
    def _start(self) -> tuple[subprocess.Popen, str]:
        """Start the server detached and ready; (its process, host:port)."""

    def up(self) -> tuple[str, bool]:
        """Start it unless it runs; (endpoint, started now)."""
        running = self.endpoint()
        if running:
            return running, False
        make_folder(self.root)
        process, endpoint = self._start()
        self._record(process.pid, endpoint)
        return endpoint, True

    def down(self) -> bool:
        """Stop it; True when one was running."""
        stopped = self._stop()
        if self.removed_on_down:
            shutil.rmtree(self.root / self.removed_on_down, ignore_errors=True)
        return stopped

    def _record(self, pid: int, endpoint: str) -> None:
        self.pid_file.write_text(f"{pid}\n")
        self.endpoint_file.write_text(endpoint + "\n")

    def _stop(self) -> bool:
        """SIGTERM (SIGKILL after 15 s); True when one was running."""
        pid = self._pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while self._pid() is not None and time.monotonic() < deadline:
                time.sleep(0.1)
            if self._pid() is not None:
                os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        self.endpoint_file.unlink(missing_ok=True)
        return pid is not None
