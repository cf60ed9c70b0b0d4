"""observability.gpu_exporter as a real process, scraped over HTTP: on a machine without a GPU it serves no
GPU series at all; with a driver, NVML's."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

from trainkit.services import LocalGpuExporter, free_port_pair


def test_without_a_gpu_the_exporter_serves_no_gpu_series(tmp_path):
    """The real process on this CPU machine: NVML does not load, so no DCGM series at all."""
    port = free_port_pair()
    command = [sys.executable, "-m", "observability.gpu_exporter", "--port", str(port), "--sysfs", str(tmp_path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, body = time.monotonic() + 30, None
        while body is None and time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                time.sleep(0.2)
        assert body is not None, "the exporter did not serve"
    finally:
        process.terminate()
        log = process.communicate(timeout=10)[0]
    if LocalGpuExporter.hardware() is None:
        assert "DCGM_" not in body and "trainkit_efa" not in body
        assert "no NVML" in log and "GPU metrics absent" in log
    else:  # a machine with a driver: the real NVML path
        assert "DCGM_FI_DEV_GPU_UTIL{" in body, body[:2000]
