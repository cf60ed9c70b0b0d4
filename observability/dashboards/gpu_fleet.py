""" "GPU fleet": every GPU the DCGM exporter (or trainkit's NVML exporter) reports, per node and GPU.

On a machine with no GPU exporter every panel stays empty and says so; nothing is filled in.
"""

from __future__ import annotations

from ..contract import GPU_METRICS, NODE_LABEL
from .common import GPU_NO_DATA, build_dashboard, query, query_variable, stat_panel, table_panel, timeseries_panel

# The node variable is named after the label it filters (dcgm-exporter's, the EFA counters' too).
SELECTED = f'{{{NODE_LABEL}=~"${NODE_LABEL}"}}'
PER_GPU = f"{{{{{NODE_LABEL}}}}} gpu {{{{gpu}}}}"


def _gpu_series(metric: str, title: str, description: str) -> object:
    unit = GPU_METRICS[metric][1]
    return timeseries_panel(title, description, unit, [query(metric + SELECTED, PER_GPU)], no_value=GPU_NO_DATA)


def _fleet_total(title: str, description: str, aggregate: str, metric: str) -> object:
    unit = "none" if aggregate == "count" else GPU_METRICS[metric][1]
    return stat_panel(title, description, unit, [query(f"{aggregate}({metric}{SELECTED})")])


def utilisation_row() -> tuple[str, list]:
    return "Utilisation", [
        _fleet_total("GPUs reporting", "GPUs with a utilisation sample.", "count", "DCGM_FI_DEV_GPU_UTIL"),
        stat_panel(
            "GPU nodes up",
            "Nodes whose GPUs report; it falls to 0 when the idle guard scales the GPU node group to zero.",
            "none",
            [query(f"count(count by ({NODE_LABEL}) (DCGM_FI_DEV_GPU_UTIL{SELECTED}))")],
        ),
        _fleet_total("Mean GPU utilisation", "Mean over the selected GPUs.", "avg", "DCGM_FI_DEV_GPU_UTIL"),
        _fleet_total("Memory used", "Framebuffer memory in use, selected GPUs.", "sum", "DCGM_FI_DEV_FB_USED"),
        _fleet_total("Power draw", "Total power draw of the selected GPUs.", "sum", "DCGM_FI_DEV_POWER_USAGE"),
        _gpu_series("DCGM_FI_DEV_GPU_UTIL", "GPU utilisation", "Time a kernel was running, per GPU."),
        _gpu_series("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory copy utilisation", "Time device memory was read or written."),
    ]


def health_row() -> tuple[str, list]:
    return "Clocks, thermals and power", [
        _gpu_series("DCGM_FI_DEV_SM_CLOCK", "SM clock", "A falling SM clock under load means throttling."),
        _gpu_series("DCGM_FI_DEV_GPU_TEMP", "GPU temperature", "Core temperature per GPU."),
        _gpu_series("DCGM_FI_DEV_POWER_USAGE", "Power draw", "Board power per GPU."),
        _gpu_series("DCGM_FI_DEV_FB_USED", "Framebuffer memory used", "Device memory in use per GPU."),
    ]


def errors_row() -> tuple[str, list]:
    return "Errors", [
        table_panel(
            "XID errors",
            "GPUs whose last XID error is not 0, with the XID code (see NVIDIA's XID catalogue).",
            [query(f"DCGM_FI_DEV_XID_ERRORS{SELECTED} != 0", instant=True)],
            no_value="no XID errors reported",
        ),
    ]


def network_row() -> tuple[str, list]:
    efa = SELECTED + "[$__rate_interval]"
    per_device = f"{{{{{NODE_LABEL}}}}} {{{{device}}}}"
    no_efa = "no data: no EFA device reports on this selection"
    return "Network (EFA)", [
        timeseries_panel(
            "EFA received",
            "Bytes per second received per EFA device.",
            "Bps",
            [query(f"rate(trainkit_efa_rx_bytes_total{efa})", per_device)],
            no_value=no_efa,
        ),
        timeseries_panel(
            "EFA transmitted",
            "Bytes per second sent per EFA device.",
            "Bps",
            [query(f"rate(trainkit_efa_tx_bytes_total{efa})", per_device)],
            no_value=no_efa,
        ),
        timeseries_panel(
            "EFA retransmits and drops",
            "Packets per second retransmitted or dropped; anything above 0 slows collectives.",
            "pps",
            [
                query(f"rate(trainkit_efa_retransmitted_packets_total{efa})", f"retransmit {per_device}"),
                query(f"rate(trainkit_efa_rx_drops_total{efa})", f"drop {per_device}"),
            ],
            width=24,
            no_value=no_efa,
        ),
    ]


def build():
    return build_dashboard(
        "GPU fleet",
        "trainkit-gpu-fleet",
        "DCGM exporter metrics per node and GPU, XID errors, EFA traffic.",
        [query_variable(NODE_LABEL, "Node", "DCGM_FI_DEV_GPU_UTIL", multi=True)],
        [utilisation_row(), health_row(), errors_row(), network_row()],
    )
