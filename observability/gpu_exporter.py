"""GPU and EFA metrics for a machine without NVIDIA's dcgm-exporter (the local profile).

    python -m observability.gpu_exporter --port 9500

GPU metrics carry the DCGM exporter's names, units and labels (observability/contract.py) so the same
dashboards and rules work on EKS (dcgm-exporter) and here; values come from NVML (nvidia-ml-py).
XID errors arrive as NVML events; like DCGM_FI_DEV_XID_ERRORS, the gauge holds the last XID seen (0
before any). Where NVML cannot load (no NVIDIA driver: CPU-only machines) no GPU series exist at
all, so GPU panels show "no data" instead of a made-up value. EFA counters are read from
`/sys/class/infiniband/<device>/ports/<port>/hw_counters/` for Amazon (PCI vendor 0x1d0f) devices.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .contract import EFA_COUNTERS, EFA_LABELS, GPU_LABELS, GPU_METRICS, NODE_LABEL, XID_LABELS

log = logging.getLogger(__name__)
AMAZON_PCI_VENDOR = "0x1d0f"
MIB = 1024 * 1024
XID = "DCGM_FI_DEV_XID_ERRORS"


def node_name() -> str:
    """dcgm-exporter's host label value: NODE_NAME (its DaemonSet sets it to the node), else the host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


def xid_text(code: int) -> str:
    """`err_msg` of the XID series: dcgm-exporter writes NVIDIA's description of the code there (its own
    table); we name the code and where it is described rather than copy that table."""
    return "No Error" if code == 0 else f"XID {code}: see NVIDIA's XID catalogue"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlCollector:
    """DCGM-named gauges for every GPU NVML sees. `nvml` is the pynvml module (a test passes its own)."""

    def __init__(self, nvml, hostname: str | None = None):
        self.nvml = nvml
        nvml.nvmlInit()
        self.hostname = hostname or node_name()
        self.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        # Identity does not change while the exporter runs: read it once, not on every scrape.
        self.gpu_labels = [self.labels(index, handle) for index, handle in enumerate(self.handles)]
        self.index_by_uuid = {nvml.nvmlDeviceGetUUID(handle): index for index, handle in enumerate(self.handles)}
        self.last_xid = dict.fromkeys(range(len(self.handles)), 0)
        self._xid_thread: threading.Thread | None = None

    def labels(self, index: int, handle) -> list[str]:
        nvml = self.nvml
        by_name = {
            "gpu": str(index),
            "UUID": nvml.nvmlDeviceGetUUID(handle),
            "pci_bus_id": nvml.nvmlDeviceGetPciInfo(handle).busId,
            "device": f"nvidia{nvml.nvmlDeviceGetMinorNumber(handle)}",
            "modelName": _text(nvml.nvmlDeviceGetName(handle)),
            NODE_LABEL: self.hostname,
            "DCGM_FI_DRIVER_VERSION": self.driver_version,
        }
        return [by_name[name] for name in GPU_LABELS]

    def readings(self, index: int, handle) -> dict[str, float]:
        nvml = self.nvml
        rates = nvml.nvmlDeviceGetUtilizationRates(handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        return {
            "DCGM_FI_DEV_GPU_UTIL": rates.gpu,
            "DCGM_FI_DEV_MEM_COPY_UTIL": rates.memory,
            "DCGM_FI_DEV_SM_CLOCK": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "DCGM_FI_DEV_GPU_TEMP": nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            "DCGM_FI_DEV_POWER_USAGE": nvml.nvmlDeviceGetPowerUsage(handle) / 1000,  # NVML: mW; DCGM: W
            "DCGM_FI_DEV_FB_USED": memory.used / MIB,  # NVML: bytes; DCGM: MiB
            "DCGM_FI_DEV_FB_FREE": memory.free / MIB,
            "DCGM_FI_DEV_XID_ERRORS": self.last_xid[index],
        }

    def collect(self):
        families = {
            name: GaugeMetricFamily(name, GPU_METRICS[name][0], labels=XID_LABELS if name == XID else GPU_LABELS)
            for name in GPU_METRICS
        }
        for index, handle in enumerate(self.handles):
            for name, value in self.readings(index, handle).items():
                labels = self.gpu_labels[index]
                if name == XID:  # the code itself is a label too, as dcgm-exporter writes it
                    labels = [*labels, str(int(value)), xid_text(int(value))]
                families[name].add_metric(labels, value)
        yield from families.values()

    def watch_xids(self) -> None:
        """Record XID events in a daemon thread (NVML delivers them to one waiting event set)."""
        nvml = self.nvml
        events = nvml.nvmlEventSetCreate()
        for handle in self.handles:
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)

        def wait_forever():
            while True:
                try:
                    event = nvml.nvmlEventSetWait_v2(events, 5000)
                except nvml.NVMLError as error:
                    if getattr(error, "value", None) != nvml.NVML_ERROR_TIMEOUT:
                        log.warning("XID events unavailable: %s", error)
                        time.sleep(5)
                    continue
                index = self.index_by_uuid.get(nvml.nvmlDeviceGetUUID(event.device))
                if index is not None:
                    self.last_xid[index] = int(event.eventData)

        self._xid_thread = threading.Thread(target=wait_forever, name="nvml-xid", daemon=True)
        self._xid_thread.start()


class EfaCollector:
    """Counters of every EFA port under `sysfs` (default /sys/class/infiniband)."""

    def __init__(self, sysfs: str | Path = "/sys/class/infiniband", hostname: str | None = None):
        self.sysfs = Path(sysfs)
        self.hostname = hostname or node_name()

    def devices(self) -> list[Path]:
        found = []
        for device in sorted(self.sysfs.glob("*")):
            vendor = device / "device" / "vendor"
            if vendor.exists() and vendor.read_text().strip() == AMAZON_PCI_VENDOR:
                found.append(device)
        return found

    def collect(self):
        families = {
            name: CounterMetricFamily(name.removesuffix("_total"), f"EFA hw_counters/{counter}", labels=EFA_LABELS)
            for counter, name in EFA_COUNTERS.items()
        }
        for device in self.devices():
            for port in sorted((device / "ports").glob("*")):
                for counter, name in EFA_COUNTERS.items():
                    path = port / "hw_counters" / counter
                    if path.exists():
                        families[name].add_metric([device.name, port.name, self.hostname], int(path.read_text()))
        yield from (family for family in families.values() if family.samples)


def build_registry(nvml=None, sysfs: str | Path = "/sys/class/infiniband") -> tuple[CollectorRegistry, list[str]]:
    """A registry with what this machine has; the second value says what that is, for the log."""
    registry, found = CollectorRegistry(), []
    if nvml is None:
        import pynvml as nvml
    try:
        gpus = NvmlCollector(nvml)
    except nvml.NVMLError as error:
        found.append(f"no NVML ({error}): GPU metrics absent")
    else:
        registry.register(gpus)
        gpus.watch_xids()
        found.append(f"{len(gpus.handles)} GPU(s) through NVML")
    efa = EfaCollector(sysfs)
    registry.register(efa)
    found.append(f"{len(efa.devices())} EFA device(s)")
    return registry, found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="DCGM-named GPU metrics from NVML, and EFA counters.")
    parser.add_argument("--port", type=int, default=9500, help="HTTP port for /metrics (default 9500)")
    parser.add_argument("--address", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument("--sysfs", default="/sys/class/infiniband", help="where EFA devices are listed")
    parser.add_argument("--root", help="state folder of the process that started it (lets it find its own pid)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    registry, found = build_registry(sysfs=args.sysfs)
    log.info("found %s", "; ".join(found))  # before the port opens: whoever scrapes it can read this line already
    start_http_server(args.port, addr=args.address, registry=registry)
    log.info("serving on %s:%d", args.address, args.port)
    threading.Event().wait()


if __name__ == "__main__":
    main()
