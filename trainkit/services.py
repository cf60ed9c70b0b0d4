"""Local servers the product starts as processes: etcd for the etcd rendezvous, Prometheus (and a GPU
exporter where there is a GPU) for metrics.

Debian's `etcd-server` (3.4) provides the binary (`make test-services` installs it). The v2 API is
switched on because torch's etcd rendezvous speaks v2. Data lives in a directory of the caller's
choosing, so a restart (`restart()`, or a crash and a new start) finds the rendezvous state again.

`EtcdServer` is one server owned by the caller (tests, the chaos harness). `LocalEtcd` is the one
`make up` starts for the local profile: a background process that outlives the command, with its
pid, endpoint, data and log under `.trainkit/etcd/` (`TRAINKIT_STATE_DIR` moves `.trainkit`);
`make down` stops it and removes its data. `invoke train --rdzv etcd` uses it when no
`--rdzv-endpoint` is given. `LocalPrometheus` and `LocalGpuExporter` are the same kind of background
server under `.trainkit/prometheus/` and `.trainkit/gpu-exporter/`.
"""

from __future__ import annotations

import abc
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
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


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def etcd_healthy(endpoint: str) -> bool:
    """Whether an etcd answers its health check at host:port."""
    return http_ok(f"http://{endpoint}/health")


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

    def stop(self) -> None:
        terminate(self.process)

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()


STATE_ENV = "TRAINKIT_STATE_DIR"


def state_dir() -> Path:
    return Path(os.environ.get(STATE_ENV, ".trainkit")).resolve()


class _Background(abc.ABC):
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
        self.root.mkdir(parents=True, exist_ok=True)
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


class LocalEtcd(_Background):
    """The local profile's etcd, started by `make up` and stopped by `make down`."""

    name = binary = "etcd"
    health_path = "/health"
    removed_on_down = "data"

    def _start(self) -> tuple[subprocess.Popen, str]:
        server = EtcdServer(self.root / "data", detach=True).start()
        return server.process, server.endpoint


# ---------------------------------------------------------------------------------------------- Prometheus

RULES_FILE = (
    Path(__file__).resolve().parents[1] / "observability" / "generated" / "rules" / "trainkit-alerts.rules.yaml"
)
RANKS_JOB, GPU_JOB = "trainkit-ranks", "trainkit-gpu"
SCRAPE_INTERVAL_ENV = "TRAINKIT_SCRAPE_INTERVAL"  # the local Prometheus's scrape interval (default 5s)


class PrometheusServer:
    """One Prometheus on 127.0.0.1 (Debian's 2.42, `make test-services`) loading trainkit's alert rules
    and scraping what the file-discovery folders under `root/targets/` list: training ranks
    (`trainkit-ranks`) and GPU exporters (`trainkit-gpu`). Adding or removing a target is writing or
    deleting a small JSON file; Prometheus picks it up within `scrape_interval`."""

    def __init__(self, root: str | Path, port: int | None = None, scrape_interval: str = "5s", detach: bool = False):
        if shutil.which("prometheus") is None:
            raise SpecError("prometheus is not installed: run `make test-services` (Debian's prometheus)")
        self.root = Path(root)
        self.port = port or free_port_pair()
        self.scrape_interval = scrape_interval
        self.detach = detach
        self.log_path = self.root / "prometheus.log"
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def config(self) -> dict:
        def job(name: str) -> dict:
            files = [str(self.root / "targets" / name / "*.json")]
            return {"job_name": name, "file_sd_configs": [{"files": files, "refresh_interval": self.scrape_interval}]}

        interval = self.scrape_interval
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(RULES_FILE)],
            "scrape_configs": [job(RANKS_JOB), job(GPU_JOB)],
        }

    def start(self, timeout: float = 60) -> PrometheusServer:
        import yaml

        for job in (RANKS_JOB, GPU_JOB):
            (self.root / "targets" / job).mkdir(parents=True, exist_ok=True)
        config = self.root / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        command = [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={self.root / 'data'}",
            f"--web.listen-address={self.endpoint}",
        ]
        ready = functools.partial(http_ok, f"http://{self.endpoint}/-/ready")
        self.process = launch(command, self.log_path, ready, f"prometheus on {self.endpoint}", timeout, self.detach)
        return self

    def stop(self) -> None:
        terminate(self.process)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()


def write_targets(root: Path, job: str, name: str, addresses: list[str]) -> Path:
    """File-discovery entry `root/targets/<job>/<name>.json`, written whole (Prometheus may read any time)."""
    path = root / "targets" / job / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.tmp")  # not matched by *.json
    partial.write_text(json.dumps([{"targets": addresses}]) + "\n")
    partial.replace(path)
    return path


class LocalPrometheus(_Background):
    """The local profile's Prometheus (`make up` / `make down`), on port 9090 when that is free."""

    name = binary = "prometheus"
    health_path = "/-/ready"
    port = 9090

    # Its data stays for the next `make up` (metrics history survives a restart); targets do not.
    removed_on_down = "targets"

    def _start(self) -> tuple[subprocess.Popen, str]:
        port = self.port if port_free(self.port) else None
        interval = os.environ.get(SCRAPE_INTERVAL_ENV, "5s")
        server = PrometheusServer(self.root, port=port, scrape_interval=interval, detach=True).start()
        return server.process, server.endpoint

    def watch_job(self, run_id: str, addresses: list[str]) -> Path | None:
        """Have the running Prometheus scrape a job's ranks; None when none runs."""
        if not addresses or self.endpoint() is None:
            return None
        return write_targets(self.root, RANKS_JOB, run_id, addresses)


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class LocalGpuExporter(_Background):
    """`observability.gpu_exporter` for the local Prometheus, started only where NVML loads or an EFA
    device exists: on a CPU-only machine there is nothing to export and GPU panels say "no data"."""

    name, binary = "gpu-exporter", "python"
    health_path = "/metrics"
    port = 9500

    @staticmethod
    def hardware() -> str | None:
        """What there is to export, or None."""
        import pynvml

        from observability.gpu_exporter import EfaCollector

        try:
            pynvml.nvmlInit()
            gpus = pynvml.nvmlDeviceGetCount()
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            gpus = 0
        efa = len(EfaCollector().devices())
        return f"{gpus} GPU(s), {efa} EFA device(s)" if gpus or efa else None

    def _start(self) -> tuple[subprocess.Popen, str]:
        port = self.port if port_free(self.port) else free_port_pair()
        endpoint = f"127.0.0.1:{port}"
        command = [sys.executable, "-m", "observability.gpu_exporter", "--port", str(port), f"--root={self.root}"]
        ready = functools.partial(self._healthy, endpoint)
        return launch(command, self.root / "exporter.log", ready, "the GPU exporter", 30, detach=True), endpoint

    def serve(self, prometheus_root: Path) -> tuple[str, str] | None:
        """Start it unless it runs (only where there is hardware to export) and list it as a scrape
        target; (endpoint, what it exports), or None."""
        hardware = self.hardware()
        if hardware is None:
            return None
        endpoint, _ = self.up()
        write_targets(prometheus_root, GPU_JOB, "gpu-exporter", [endpoint])
        return endpoint, hardware
