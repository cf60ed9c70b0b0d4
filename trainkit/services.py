"""Local servers the product starts as processes: etcd for the etcd rendezvous.

Debian's `etcd-server` (3.4) provides the binary (`make test-services` installs it). The v2 API is
switched on because torch's etcd rendezvous speaks v2. Data lives in a directory of the caller's
choosing, so a restart (`restart()`, or a crash and a new start) finds the rendezvous state again.

`EtcdServer` is one server owned by the caller (tests, the chaos harness). `LocalEtcd` is the one
`make up` starts for the local profile: a background process that outlives the command, with its
pid, endpoint, data and log under `.trainkit/etcd/` (`TRAINKIT_STATE_DIR` moves `.trainkit`);
`make down` stops it and removes its data. `invoke train --rdzv etcd` uses it when no
`--rdzv-endpoint` is given.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from .errors import SpecError


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


def etcd_healthy(endpoint: str) -> bool:
    """Whether an etcd answers its health check at host:port."""
    try:
        with urllib.request.urlopen(f"http://{endpoint}/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


class EtcdServer:
    """One etcd member on 127.0.0.1: client port p, peer port p + 1, data under `data_dir`."""

    def __init__(self, data_dir: str | Path, port: int | None = None, detach: bool = False):
        if shutil.which("etcd") is None:
            raise SpecError("etcd is not installed: run `make test-services` (Debian's etcd-server)")
        self.data_dir = Path(data_dir)
        self.port = port or free_port_pair()
        self.detach = detach  # own session: outlives the command that started it
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        """host:port, as --rdzv-endpoint takes it."""
        return f"127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        url, peer = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.port + 1}"
        return [
            "etcd",
            "--enable-v2=true",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
        ]

    def start(self, timeout: float = 30) -> EtcdServer:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(
                self._command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=self.detach
            )
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start on {self.endpoint}; see {self.log_path}")
            time.sleep(0.1)
        return self

    def healthy(self) -> bool:
        return etcd_healthy(self.endpoint)

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self, down_seconds: float = 1.0) -> None:
        """Crash and come back on the same port and data, as a restarted pod with its volume does."""
        self.kill()
        time.sleep(down_seconds)
        self.start()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()


STATE_ENV = "TRAINKIT_STATE_DIR"


def state_dir() -> Path:
    return Path(os.environ.get(STATE_ENV, ".trainkit")).resolve()


class LocalEtcd:
    """The local profile's etcd, started by `make up` and stopped by `make down`."""

    def __init__(self, root: Path | None = None):
        self.root = (root or state_dir()) / "etcd"
        self.pid_file, self.endpoint_file = self.root / "pid", self.root / "endpoint"

    def _pid(self) -> int | None:
        """The recorded pid, if that process is still our etcd (not a reused pid)."""
        try:
            pid = int(self.pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        ours = cmdline and Path(cmdline[0].decode()).name == "etcd" and str(self.root).encode() in b" ".join(cmdline)
        return pid if ours else None

    def endpoint(self) -> str | None:
        """host:port of the running local etcd, or None."""
        if self._pid() is None or not self.endpoint_file.exists():
            return None
        endpoint = self.endpoint_file.read_text().strip()
        return endpoint if etcd_healthy(endpoint) else None

    def up(self) -> tuple[str, bool]:
        """Start it unless it runs; (endpoint, started now)."""
        running = self.endpoint()
        if running:
            return running, False
        self.root.mkdir(parents=True, exist_ok=True)
        server = EtcdServer(self.root / "data", detach=True).start()
        self.pid_file.write_text(f"{server.process.pid}\n")
        self.endpoint_file.write_text(server.endpoint + "\n")
        return server.endpoint, True

    def down(self) -> bool:
        """Stop it and remove its data; True when one was running."""
        pid = self._pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while self._pid() is not None and time.monotonic() < deadline:
                time.sleep(0.1)
            if self._pid() is not None:
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root / "data", ignore_errors=True)
        self.pid_file.unlink(missing_ok=True)
        self.endpoint_file.unlink(missing_ok=True)
        return pid is not None
