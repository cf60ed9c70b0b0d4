"""The metric names every dashboard and rule is built on, in one place.

Training ranks serve the `trainkit_*` gauges of `training.common.metrics` (labels run_id, model, rank,
node). GPU metrics use the NVIDIA DCGM exporter's names and units (dcgm-exporter
`etc/default-counters.csv`) and label names (GPU_LABELS below, from its source at the pinned chart),
whether dcgm-exporter serves them (EKS) or `observability.gpu_exporter` does from NVML (a machine
without DCGM). EFA counters come from the exporter's reading of
`/sys/class/infiniband/<device>/ports/<port>/hw_counters/`. On EKS kube-state-metrics serves the Kubernetes
objects' `kube_*` series; KUBE_STATE_METRICS lists the ones the rules use.
"""

from __future__ import annotations

from training.common.metrics import GAUGES as TRAINING_GAUGES

MONITORING_NAMESPACE = "trainkit-monitoring"
"""Namespace of kube-prometheus-stack and dcgm-exporter on the cluster (the platform stack creates it;
trainkit.backends.eks.cluster and the PrometheusRule both name it from here)."""

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

# dcgm-exporter 4.8.2 (tag 4.5.3-4.8.2; the chart pinned in terraform/stacks/platform/main.tf), label names
# of a per-GPU series in the order it writes them: the GPU template's fixed labels, `Hostname` (capital H:
# internal/pkg/rendermetrics/render_metrics.go, gpuMetricsFormat, L47; the node name from NODE_NAME,
# which the chart's DaemonSet sets), then the counters of type `label` (DCGM_FI_DRIVER_VERSION,
# etc/default-counters.csv L77; internal/pkg/collector/gpu_collector.go L312-315). Only NVLink series use
# lowercase `hostname`; the release after 4.8.2 renames it to `hostname` everywhere (main, #655): change
# NODE_LABEL with the chart.
NODE_LABEL = "Hostname"
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", NODE_LABEL, "DCGM_FI_DRIVER_VERSION")
# DCGM_FI_DEV_XID_ERRORS also carries the XID as `err_code` and its description as `err_msg`
# (gpu_collector.go L323-332).
XID_LABELS = (*GPU_LABELS, "err_code", "err_msg")
# On EKS, GPUs allocated to a pod also carry that pod's (internal/pkg/transformation/const.go L21-23);
# idle GPUs carry none of them.
POD_LABELS = ("namespace", "pod", "container")

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
EFA_LABELS = ("device", "port", NODE_LABEL)  # our exporter; the node label named as the GPU series'


# Kubernetes objects, from kube-state-metrics. kube-prometheus-stack 88.5.3 (pinned in
# terraform/stacks/platform/main.tf) deploys it as its subchart kube-state-metrics 8.4.0 (the chart's Chart.yaml
# dependencies; app v2.20.0), on by default (values.yaml kubeStateMetrics.enabled), with the cronjobs, nodes and pods
# collectors in the subchart's default `collectors`, and scrapes it through a ServiceMonitor with honorLabels, so a
# series keeps its own `namespace`. Names and labels as v2.20.0 writes them
# (github.com/kubernetes/kube-state-metrics/blob/v2.20.0/docs/metrics/workload/cronjob-metrics.md,
# .../cluster/node-metrics.md, .../workload/pod-metrics.md, and internal/store/{cronjob,node,pod}.go there; a family
# is absent while its field is unset). A resource name is sanitised into a label value (SanitizeLabelName in
# internal/store/utils.go): nvidia.com/gpu becomes GPU_RESOURCE, an extended resource with unit "integer".
CRONJOB_LABELS = ("namespace", "cronjob")
POD_OBJECT_LABELS = ("namespace", "pod", "uid")
GPU_RESOURCE = "nvidia_com_gpu"
# name -> (meaning, labels)
KUBE_STATE_METRICS = {
    "kube_cronjob_created": ("Unix time the CronJob was created.", CRONJOB_LABELS),
    "kube_cronjob_status_last_successful_time": (
        "Unix time the CronJob's last successful Job completed (status.lastSuccessfulTime, which the CronJob "
        "controller sets from the Job's completionTime); absent until one has.",
        CRONJOB_LABELS,
    ),
    "kube_node_status_capacity": (
        f'A node\'s capacity of each resource (status.capacity); resource="{GPU_RESOURCE}" is the GPUs the NVIDIA '
        "device plugin advertises.",
        ("node", "resource", "unit"),
    ),
    "kube_pod_container_resource_requests": (
        f'What a container requests of each resource; resource="{GPU_RESOURCE}" is its GPUs. `node` is empty until '
        "the pod is scheduled.",
        (*POD_OBJECT_LABELS, "container", "node", "resource", "unit"),
    ),
    "kube_pod_status_unschedulable": (
        "1 while the pod's PodScheduled condition is False (the scheduler found no node for it); absent otherwise.",
        POD_OBJECT_LABELS,
    ),
}


def known_metrics() -> set[str]:
    """Every metric name a query may use."""
    return set(TRAINING_GAUGES) | set(GPU_METRICS) | set(EFA_COUNTERS.values()) | set(KUBE_STATE_METRICS)
