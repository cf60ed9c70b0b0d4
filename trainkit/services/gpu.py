"""The local profile's GPU exporter (`observability.gpu_exporter`), started only where there is hardware
to export."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

from trainkit.services.process import Background, free_port_pair, launch, port_free
from trainkit.services.prometheus import GPU_JOB, write_targets


class LocalGpuExporter(Background):
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
