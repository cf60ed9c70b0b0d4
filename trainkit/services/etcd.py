"""etcd for the etcd rendezvous: `EtcdServer`, one server owned by its caller (tests, the chaos harness),
and `LocalEtcd`, the one `make up` starts for the local profile.

Debian's `etcd-server` (3.4) provides the binary (`make test-services` installs it). The v2 API is
switched on because torch's etcd rendezvous speaks v2. Data lives in a directory of the caller's
choosing, so a restart (`restart()`, or a crash and a new start) finds the rendezvous state again.
`LocalEtcd` outlives the command that starts it, with its pid, endpoint, data and log under
`.trainkit/etcd/`; `make down` stops it and removes its data. `invoke train --rdzv etcd` uses it when
no `--rdzv-endpoint` is given.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from trainkit.errors import SpecError
from trainkit.services.process import Background, OwnedServer, free_port_pair, http_ok, launch


def etcd_healthy(endpoint: str) -> bool:
    """Whether an etcd answers its health check at host:port."""
    return http_ok(f"http://{endpoint}/health")


class EtcdServer(OwnedServer):
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
        what = f"etcd on {self.endpoint}"
        self.process = launch(self._command(), self.log_path, self.healthy, what, timeout, self.detach)
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


class LocalEtcd(Background):
    """The local profile's etcd, started by `make up` and stopped by `make down`."""

    name = binary = "etcd"
    health_path = "/health"
    removed_on_down = "data"

    def _start(self) -> tuple[subprocess.Popen, str]:
        server = EtcdServer(self.root / "data", detach=True).start()
        return server.process, server.endpoint
