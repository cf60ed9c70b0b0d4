"""Alert rules, written once and emitted twice: a plain Prometheus rules file (the local Prometheus,
`promtool`) and a `PrometheusRule` object (kube-prometheus-stack's operator on the cluster).

Thresholds are module constants so a team can see and change them in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from .contract import CRONJOB_LABELS, GPU_RESOURCE, MONITORING_NAMESPACE
from .contract import NODE_LABEL as NODE

GPU_UTIL_LOW_PERCENT = 50
GPU_UTIL_LOW_FOR = "10m"
# H100/H200 SXM slow their clocks near 87 C (NVIDIA's thermal slowdown); warn before that.
GPU_TEMP_HIGH_C = 85
STALL_SECONDS = 300
# The idle guard's own rule (trainkit/backends/eks/idle_decision.py: every sample below 5%), over its suggested window.
GPU_IDLE_PERCENT = 5
GPU_IDLE_FOR = "30m"
RESTART_WINDOW = "15m"
# The idle guard's CronJob (terraform/stacks/platform/main.tf, in the platform namespace; a run that cannot check or
# act exits non-zero, so its Job fails and the CronJob's last success stops moving). One failed run is retried by the
# next; no success for four schedules is a cause that stays (a role, RBAC, Prometheus, the node group).
IDLE_GUARD_CRONJOB = "trainkit-idle-guard"
IDLE_GUARD_EVERY_MINUTES = 5
IDLE_GUARD_SILENT_SECONDS = 4 * IDLE_GUARD_EVERY_MINUTES * 60
# The guard keeps GPU nodes whose utilisation it cannot see (missing data is never idleness), so an exporter that is
# down keeps them up for good. An hour leaves a node that just joined time to start dcgm-exporter and be scraped.
GPU_METRICS_MISSING_FOR = "1h"
# Past the guard's window a GPU pod the scheduler cannot place no longer counts as activity (its suggested window,
# as GPU_IDLE_FOR).
GPU_POD_UNSCHEDULABLE_FOR = GPU_IDLE_FOR
RULE_LABELS = {"app.kubernetes.io/part-of": "trainkit"}


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    summary: str
    description: str
    severity: str
    duration: str = "0m"

    def rule(self) -> dict:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.duration,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description},
        }


GPU_ALERTS = [
    Alert(
        "GpuXidError",
        "DCGM_FI_DEV_XID_ERRORS != 0",
        "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} reported XID {{ $value }}",
        "An XID is the driver reporting a GPU fault (catalogue: NVIDIA's XID errors document). Drain the "
        "node if it repeats; jobs on it restart elsewhere from their last checkpoint.",
        "critical",
    ),
    Alert(
        "GpuUnderutilised",
        # Only GPUs of a running job: on EKS both sides carry the training pod's namespace/pod (DCGM's pod
        # mapping, the PodMonitor's target labels); on one machine neither does, so every GPU qualifies.
        f"(DCGM_FI_DEV_GPU_UTIL < {GPU_UTIL_LOW_PERCENT})"
        " and on (namespace, pod) group by (namespace, pod) (trainkit_train_step)",
        "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} below "
        f"{GPU_UTIL_LOW_PERCENT}% for {GPU_UTIL_LOW_FOR} during a run",
        "The job is starved: look at the Training run dashboard's input wait and per-rank skew, and at "
        "EFA traffic, before adding nodes.",
        "warning",
        GPU_UTIL_LOW_FOR,
    ),
    Alert(
        "GpuTemperatureHigh",
        f"DCGM_FI_DEV_GPU_TEMP > {GPU_TEMP_HIGH_C}",
        "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} at {{ $value }} C",
        f"Above {GPU_TEMP_HIGH_C} C the GPU is close to thermal slowdown; its SM clock drops and the whole "
        "job waits for it.",
        "warning",
        "5m",
    ),
    Alert(
        "GpuNodeIdle",
        # every 5-minute window under the threshold, for the whole time: a spike between evaluations counts, and a
        # node that just came up is not idle yet
        f"max by ({NODE}) (max_over_time(DCGM_FI_DEV_GPU_UTIL[5m])) < {GPU_IDLE_PERCENT}",
        "GPU node {{ $labels.Hostname }} has been idle for " + GPU_IDLE_FOR,
        f"Every GPU of the node stayed below {GPU_IDLE_PERCENT}% for {GPU_IDLE_FOR}, and it costs its hourly "
        "price all the same. The idle guard (idle_guard_minutes at `make up`, docs/eks.md) scales an idle GPU node "
        "group to zero; without it, `make down` or lower the node group's size.",
        "warning",
        GPU_IDLE_FOR,
    ),
]

TRAINING_ALERTS = [
    Alert(
        "TrainingStalled",
        f"time() - max by (run_id, model) (trainkit_last_step_timestamp_seconds) > {STALL_SECONDS}",
        "run {{ $labels.run_id }} has logged no step for {{ $value | humanizeDuration }}",
        "Ranks are up but not stepping: a hung collective, a dead peer or a stuck input pipeline. "
        "`invoke logs --run-id <run>` shows the ranks; stopping the job keeps its last checkpoint. The stall "
        "watchdog restarts such a job once a rank passes its allowance (at least 10 min in a checkpoint or a "
        "process's first steps; off with --stall-timeout 0).",
        "critical",
    ),
    Alert(
        "TrainingLossNotFinite",
        "count by (run_id, model) (trainkit_train_loss != trainkit_train_loss or abs(trainkit_train_loss) == Inf) > 0",
        "run {{ $labels.run_id }} reports a NaN or infinite loss",
        "The run diverged; lower the learning rate or raise warm-up and resume from a checkpoint before it.",
        "critical",
    ),
    Alert(
        "TrainingRankRestarted",
        # Across series, so a restarted pod on a new address (a new series) still counts.
        f"max by (run_id, model) (max_over_time(trainkit_restarts[{RESTART_WINDOW}]))"
        f" > min by (run_id, model) (min_over_time(trainkit_restarts[{RESTART_WINDOW}]))",
        "run {{ $labels.run_id }} restarted from a checkpoint (restart {{ $value }})",
        "A rank or node was lost and the job re-formed. Check `invoke status` for the cause; repeated "
        "restarts on one node point at its hardware.",
        "warning",
    ),
    Alert(
        "TrainingStallRestarted",
        # Across series, as TrainingRankRestarted: the restarted ranks may be new series.
        f"max by (run_id, model) (max_over_time(trainkit_stall_restarts[{RESTART_WINDOW}]))"
        f" > min by (run_id, model) (min_over_time(trainkit_stall_restarts[{RESTART_WINDOW}]))",
        "run {{ $labels.run_id }} was restarted by the stall watchdog (stall restart {{ $value }})",
        "A rank stopped stepping while its process stayed alive; the watchdog dumped every rank's stacks into its "
        "log and restarted the job from its last checkpoint. The `stalled` event in the run's events.jsonl names "
        "the ranks that did not arrive and what each was doing.",
        "warning",
    ),
]

_GUARD = f'{{cronjob="{IDLE_GUARD_CRONJOB}"}}'
_BY_CRONJOB = ", ".join(CRONJOB_LABELS)

# Per node: the GPUs the device plugin advertises, and those with a utilisation series, one per (Hostname, gpu)
# whatever pod labels it carries; dcgm-exporter's Hostname is the node's name (observability/contract.py).
_GPU_CAPACITY = f'max by (node) (kube_node_status_capacity{{resource="{GPU_RESOURCE}"}} > 0)'
_GPUS_REPORTING = (
    f'count by (node) (label_replace(group by ({NODE}, gpu) (DCGM_FI_DEV_GPU_UTIL), "node", "$1", "{NODE}", "(.+)"))'
)

PLATFORM_ALERTS = [
    Alert(
        "IdleGuardFailing",
        # Seconds since its last successful run; a guard that has never succeeded counts from its creation.
        f"(time() - max by ({_BY_CRONJOB}) (kube_cronjob_status_last_successful_time{_GUARD}))"
        f" > {IDLE_GUARD_SILENT_SECONDS}"
        f" or ((time() - max by ({_BY_CRONJOB}) (kube_cronjob_created{_GUARD})) > {IDLE_GUARD_SILENT_SECONDS}"
        f" unless on ({_BY_CRONJOB}) kube_cronjob_status_last_successful_time{_GUARD})",
        "the idle guard {{ $labels.namespace }}/{{ $labels.cronjob }} has had no successful run for "
        "{{ $value | humanizeDuration }}",
        f"None of the guard's runs (every {IDLE_GUARD_EVERY_MINUTES} minutes) has succeeded for "
        f"{IDLE_GUARD_SILENT_SECONDS // 60} minutes, "
        "so an idle GPU node group is not scaled to zero and keeps costing its hourly price. Each failed run says why "
        "in one line: `kubectl -n {{ $labels.namespace }} get jobs` lists the last runs, `kubectl -n "
        "{{ $labels.namespace }} logs job/<name>` prints it (an AWS or Kubernetes refusal names the role or Role to "
        "fix). `invoke status` shows its last successful check.",
        "warning",
    ),
    Alert(
        "GpuUtilisationMissing",
        # The GPUs missing from the utilisation series; a node with none of them reporting counts them all.
        f"{_GPU_CAPACITY} - ({_GPUS_REPORTING} or on (node) {_GPU_CAPACITY} * 0) > 0",
        "GPU node {{ $labels.node }} has {{ $value }} GPU(s) without utilisation data",
        f"The node has had GPUs for {GPU_METRICS_MISSING_FOR} while Prometheus has no DCGM_FI_DEV_GPU_UTIL for "
        "{{ $value }} of them. The idle guard never scales down on data it does not have, so it keeps the GPU node "
        "group up however idle it is (and GpuNodeIdle and the GPU dashboards see nothing). Check the dcgm-exporter "
        f"DaemonSet's pod on this node (`kubectl -n {MONITORING_NAMESPACE} get pods -o wide -l "
        "app.kubernetes.io/name=dcgm-exporter`: one Running per GPU node) and that Prometheus scrapes it through "
        f"its ServiceMonitor (`kubectl -n {MONITORING_NAMESPACE} get servicemonitor dcgm-exporter`, Prometheus's "
        "Status > Targets).",
        "warning",
        GPU_METRICS_MISSING_FOR,
    ),
    Alert(
        "GpuPodUnschedulable",
        f'sum by (namespace, pod) (kube_pod_container_resource_requests{{resource="{GPU_RESOURCE}"}}) > 0'
        " and on (namespace, pod) (kube_pod_status_unschedulable == 1)",
        "pod {{ $labels.namespace }}/{{ $labels.pod }} asks for {{ $value }} GPUs and has found no node for "
        + GPU_POD_UNSCHEDULABLE_FOR,
        "The scheduler cannot place it: it asks for more than one node has (GPUs, EFA devices, memory), the GPU node "
        "group is at its maxSize, or no node of the kind it selects has come up. `kubectl -n {{ $labels.namespace }} "
        "describe pod {{ $labels.pod }}` shows the scheduler's reason under Events. A pod that waits longer than the "
        "idle guard's window no longer counts as activity, so GPU nodes that came up for it are scaled to zero "
        "again: change the job's request or the node group (`make up`), then resubmit.",
        "warning",
        GPU_POD_UNSCHEDULABLE_FOR,
    ),
]

GROUPS = {"trainkit-gpu": GPU_ALERTS, "trainkit-training": TRAINING_ALERTS, "trainkit-platform": PLATFORM_ALERTS}


def alerts() -> list[Alert]:
    return [alert for group in GROUPS.values() for alert in group]


def rule_groups() -> dict:
    """The plain rules file (`rule_files:` of prometheus.yml, `promtool check rules`)."""
    return {"groups": [{"name": name, "rules": [a.rule() for a in group]} for name, group in GROUPS.items()]}


def prometheus_rule(namespace: str) -> dict:
    """The same groups as a monitoring.coreos.com/v1 PrometheusRule."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "trainkit-alerts", "namespace": namespace, "labels": dict(RULE_LABELS)},
        "spec": rule_groups(),
    }
