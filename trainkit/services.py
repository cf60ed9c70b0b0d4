"""Local servers the product starts as processes: etcd for the etcd rendezvous.

Debian's `etcd-server` (3.4) provides the binary (`make test-services` installs it). The v2 API is
switched on because torch's etcd rendezvous speaks v2. Data lives in a directory of the caller's
choosing, so a restart (`restart()`, or a crash and a new start) finds the rendezvous state again.
"""

from __future__ import annotations

import shutil
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


class EtcdServer:
    """One etcd member on 127.0.0.1: client port p, peer port p + 1, data under `data_dir`."""

    def __init__(self, data_dir: str | Path, port: int | None = None):
        if shutil.which("etcd") is None:
            raise SpecError("etcd is not installed: run `make test-services` (Debian's etcd-server)")
        self.data_dir = Path(data_dir)
        self.port = port or free_port_pair()
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
            self.process = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start on {self.endpoint}; see {self.log_path}")
            time.sleep(0.1)
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

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
