"""Prometheus for local runs: `PrometheusServer` (one server, loading trainkit's alert rules and
scraping file-discovered targets) and `LocalPrometheus`, the local profile's (`make up` / `make down`)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from importlib.resources import files
from pathlib import Path

from trainkit.errors import SpecError
from trainkit.services.process import Background, OwnedServer, free_port_pair, http_ok, launch, port_free

RULES = "trainkit-alerts.rules.yaml"
"""The generated alert rules, package data of observability (generated/rules/); each server loads a copy
in its own folder, so an installed package (not only a checkout) provides them."""
RANKS_JOB, GPU_JOB = "trainkit-ranks", "trainkit-gpu"
SCRAPE_INTERVAL_ENV = "TRAINKIT_SCRAPE_INTERVAL"  # the local Prometheus's scrape interval (default 5s)


class PrometheusServer(OwnedServer):
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
            "rule_files": [str(self.root / RULES)],
            "scrape_configs": [job(RANKS_JOB), job(GPU_JOB)],
        }

    def start(self, timeout: float = 60) -> PrometheusServer:
        import yaml

        for job in (RANKS_JOB, GPU_JOB):
            (self.root / "targets" / job).mkdir(parents=True, exist_ok=True)
        (self.root / RULES).write_text(files("observability").joinpath("generated", "rules", RULES).read_text())
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


def write_targets(root: Path, job: str, name: str, addresses: list[str]) -> Path:
    """File-discovery entry `root/targets/<job>/<name>.json`, written whole (Prometheus may read any time)."""
    path = root / "targets" / job / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.tmp")  # not matched by *.json
    partial.write_text(json.dumps([{"targets": addresses}]) + "\n")
    partial.replace(path)
    return path


class LocalPrometheus(Background):
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
