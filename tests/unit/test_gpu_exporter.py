"""observability.gpu_exporter in-process: DCGM names, units and labels from NVML; EFA counters from sysfs.
The exporter as a process serving nothing where there is no GPU: tests/integration/test_gpu_exporter_process.py.

No GPU here, so NVML itself is replaced by a small stand-in with NVML's call signatures and units
(pynvml's: mW, bytes); what is tested is our mapping onto DCGM's names and units. The exporter on
real NVML is measured only where a GPU is lent (see observability/README.md).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pynvml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from observability.contract import GPU_LABELS, GPU_METRICS, XID_LABELS
from observability.gpu_exporter import EfaCollector, build_registry


class OneH100:
    """pynvml's functions for one GPU, as NVML reports them."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = pynvml.NVML_CLOCK_SM, pynvml.NVML_TEMPERATURE_GPU
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self):
        self.xids = [SimpleNamespace(device="h0", eventData=79)]

    def nvmlInit(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"h{index}"

    def nvmlDeviceGetUUID(self, handle):
        return "GPU-1b2c3d4e-0000-0000-0000-000000000000"

    def nvmlDeviceGetPciInfo(self, handle):
        return SimpleNamespace(busId="00000000:53:00.0")

    def nvmlDeviceGetMinorNumber(self, handle):
        return 0

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=97, memory=41)

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61

    def nvmlDeviceGetPowerUsage(self, handle):
        return 612_345  # mW

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=70 * 1024**3, free=10 * 1024**3)

    def nvmlEventSetCreate(self):
        return "events"

    def nvmlDeviceRegisterEvents(self, handle, kind, events):
        assert kind == self.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait_v2(self, events, timeout_ms):
        if self.xids:
            return self.xids.pop()
        time.sleep(timeout_ms / 1000)
        raise pynvml.NVMLError(self.NVML_ERROR_TIMEOUT)


def scrape(registry) -> dict[str, list]:
    text = generate_latest(registry).decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_nvml_readings_become_dcgm_names_units_and_labels(tmp_path, monkeypatch):
    monkeypatch.setenv("NODE_NAME", "ip-10-0-1-5.ec2.internal")
    registry, found = build_registry(nvml=OneH100(), sysfs=tmp_path)
    assert found[0] == "1 GPU(s) through NVML"
    deadline = time.monotonic() + 5
    while scrape(registry)["DCGM_FI_DEV_XID_ERRORS"][0].value == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # the XID thread records the event
    metrics = scrape(registry)
    assert set(GPU_METRICS) <= set(metrics)
    value = {name: metrics[name][0].value for name in GPU_METRICS}
    assert value["DCGM_FI_DEV_GPU_UTIL"] == 97 and value["DCGM_FI_DEV_MEM_COPY_UTIL"] == 41
    assert value["DCGM_FI_DEV_POWER_USAGE"] == 612.345  # W
    assert value["DCGM_FI_DEV_FB_USED"] == 70 * 1024 and value["DCGM_FI_DEV_FB_FREE"] == 10 * 1024  # MiB
    assert value["DCGM_FI_DEV_SM_CLOCK"] == 1980 and value["DCGM_FI_DEV_GPU_TEMP"] == 61
    assert value["DCGM_FI_DEV_XID_ERRORS"] == 79
    labels = metrics["DCGM_FI_DEV_GPU_UTIL"][0].labels
    assert set(labels) == set(GPU_LABELS)
    assert labels["device"] == "nvidia0" and labels["modelName"] == "NVIDIA H100 80GB HBM3" and labels["gpu"] == "0"
    assert labels["Hostname"] == "ip-10-0-1-5.ec2.internal"  # NODE_NAME first, as dcgm-exporter reads it
    assert labels["DCGM_FI_DRIVER_VERSION"] == "580.159.04"
    xid = metrics["DCGM_FI_DEV_XID_ERRORS"][0].labels
    assert set(xid) == set(XID_LABELS) and xid["err_code"] == "79"


def efa_device(sysfs, name: str, vendor: str, counters: dict[str, int]) -> None:
    (sysfs / name / "device").mkdir(parents=True)
    (sysfs / name / "device" / "vendor").write_text(vendor + "\n")
    hw = sysfs / name / "ports" / "1" / "hw_counters"
    hw.mkdir(parents=True)
    for counter, value in counters.items():
        (hw / counter).write_text(f"{value}\n")


def test_efa_counters_come_from_amazon_devices_only(tmp_path):
    efa_device(tmp_path, "rdmap16s27", "0x1d0f", {"rx_bytes": 123456789, "tx_bytes": 987654321, "rdma_read_bytes": 5})
    efa_device(tmp_path, "mlx5_0", "0x15b3", {"rx_bytes": 1})  # a Mellanox HCA: not ours to report
    metrics = scrape(build_registry(nvml=pynvml, sysfs=tmp_path)[0])
    rx = [s for s in metrics["trainkit_efa_rx_bytes"] if s.name.endswith("_total")]
    assert [(s.labels["device"], s.labels["port"], s.value) for s in rx] == [("rdmap16s27", "1", 123456789)]
    assert metrics["trainkit_efa_rdma_read_bytes"][0].value == 5
    assert "trainkit_efa_retransmitted_packets" not in metrics  # no such file on this device: no series
    assert [d.name for d in EfaCollector(tmp_path).devices()] == ["rdmap16s27"]


# dcgm-exporter 4.8.2 (github.com/NVIDIA/dcgm-exporter, tag 4.5.3-4.8.2), read from its source: the label
# names of a per-GPU series (not a MIG instance) as the GPU template writes them,
# internal/pkg/rendermetrics/render_metrics.go L47 (gpu, the UUID label, pci_bus_id, device, modelName,
# then Hostname when the host name is set, which the chart's NODE_NAME makes always), the UUID label's name
# internal/pkg/collector/gpu_collector.go L316-319 ("UUID" without --use-old-namespace), then the
# `label`-type counters of the chart's default counters file (etc/default-counters.csv L77:
# DCGM_FI_DRIVER_VERSION), and on the XID series the attributes gpu_collector.go L323-332 adds.
UPSTREAM_GPU_SERIES_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
UPSTREAM_XID_ATTRIBUTES = ["err_code", "err_msg"]
UPSTREAM_POD_LABELS = ["pod", "namespace", "container"]  # internal/pkg/transformation/const.go L21-23


def test_the_contract_uses_the_label_names_dcgm_exporter_writes():
    from observability import contract

    assert list(contract.GPU_LABELS) == UPSTREAM_GPU_SERIES_LABELS
    assert list(contract.XID_LABELS) == UPSTREAM_GPU_SERIES_LABELS + UPSTREAM_XID_ATTRIBUTES
    assert sorted(contract.POD_LABELS) == sorted(UPSTREAM_POD_LABELS)
    assert contract.NODE_LABEL in contract.EFA_LABELS  # one node label for every panel of the fleet dashboard
