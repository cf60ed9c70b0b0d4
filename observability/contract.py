"""The metric names every dashboard and rule is built on, in one place.

Training ranks serve the `trainkit_*` gauges of `training.common.metrics` (labels run_id, model, rank,
node). GPU metrics use the NVIDIA DCGM exporter's names and units (dcgm-exporter
`etc/default-counters.csv`) and labels (gpu, UUID, pci_bus_id, device, modelName, hostname), whether
dcgm-exporter serves them (EKS) or `observability.gpu_exporter` does from NVML (a machine without
DCGM). EFA counters come from the exporter's reading of
`/sys/class/infiniband/<device>/ports/<port>/hw_counters/`.
"""

from __future__ import annotations

from training.common.metrics import GAUGES as TRAINING_GAUGES

MONITORING_NAMESPACE = "trainkit-monitoring"
"""Namespace of kube-prometheus-stack and dcgm-exporter on the cluster (the platform stack creates it;
trainkit.cluster and the PrometheusRule both name it from here)."""

TRAINING_LABELS = ("run_id", "model", "rank", "node")

# name -> (help text, Grafana unit)
GPU_METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": ("GPU utilization (in %).", "percent"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("Memory utilization (in %).", "percent"),
    "DCGM_FI_DEV_SM_CLOCK": ("SM clock frequency (in MHz).", "rotmhz"),
    "DCGM_FI_DEV_GPU_TEMP": ("GPU temperature (in C).", "celsius"),
    "DCGM_FI_DEV_POWER_USAGE": ("Power draw (in W).", "watt"),
    "DCGM_FI_DEV_FB_USED": ("Framebuffer memory used (in MiB).", "mbytes"),
    "DCGM_FI_DEV_FB_FREE": ("Framebuffer memory free (in MiB).", "mbytes"),
    "DCGM_FI_DEV_XID_ERRORS": ("Value of the last XID error encountered.", "none"),
}
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname")

# EFA hw_counters file -> metric name (counters; absent where the device does not have the file).
EFA_COUNTERS = {
    "rx_bytes": "trainkit_efa_rx_bytes_total",
    "tx_bytes": "trainkit_efa_tx_bytes_total",
    "rx_pkts": "trainkit_efa_rx_packets_total",
    "tx_pkts": "trainkit_efa_tx_packets_total",
    "rdma_read_bytes": "trainkit_efa_rdma_read_bytes_total",
    "rdma_write_bytes": "trainkit_efa_rdma_write_bytes_total",
    "retrans_pkts": "trainkit_efa_retransmitted_packets_total",
    "rx_drops": "trainkit_efa_rx_drops_total",
}
EFA_LABELS = ("device", "port", "hostname")


def known_metrics() -> set[str]:
    """Every metric name a query may use."""
    return set(TRAINING_GAUGES) | set(GPU_METRICS) | set(EFA_COUNTERS.values())
