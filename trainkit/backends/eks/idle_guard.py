"""The idle-cluster guard: GPU nodes to zero when nothing used them for a window, and back when a job waits.

    python -m trainkit.backends.eks.idle_guard --cluster trainkit --nodegroup gpu --region us-east-1

The platform stack runs this as a CronJob (the infra stack's idle_guard_minutes, 30 by default) in an image of its own
(the `guard` stage of containers/train/Dockerfile, which `make up` pushes: trainkit/infra/images.py), under a Pod
Identity role whose only write is this node group's UpdateNodegroupConfig (terraform/modules/
gpu-nodegroup). Each run gathers three things, then `decide` (pure) says scale down, scale up or keep, and why:
- what uses or waits for the GPU nodes, in every namespace: PyTorchJobs whose replicas request nvidia.com/gpu
  (with their pods; one whose pods are not created yet counts too) and every other pod, of any kind but a
  DaemonSet's, that requests nvidia.com/gpu and has not ended. One that has not ended, or that ended within the
  window, is activity; when the nodes its pods are bound to plus what waits need more than the group asks for,
  that is a reason to scale up (to at most maxSize; never for a job whose minimum is wider than that); one none
  of whose pods can run for longer than the window (unschedulable, an image that cannot be pulled, no pods at
  all) counts for neither (an Event says so once);
- DCGM_FI_DEV_GPU_UTIL of every GPU over the window, from the platform's Prometheus: every GPU the GPU nodes
  have must report for the whole window and stay below IDLE_PERCENT; no series, a series with gaps or fewer GPUs
  reporting than the nodes have all count as activity (no data never scales anything down), and so do nodes
  asked for that never joined; the status records since when data has been missing, and past MISSING_DATA_ALERT_S
  with nodes up each run records a Warning Event and fails (below), while it still keeps;
- the node group (EKS DescribeNodegroup): changing, or at zero with nothing waiting, is left alone.
What it found and did goes into the ConfigMap `trainkit-idle-guard` (trainkit-system), which `invoke status`
reads, and a scale-down or scale-up also into a Kubernetes Event on that ConfigMap (`kubectl get events -n
trainkit-system`). A run that cannot check or act exits 1 with one line on why, so its Job fails; the alert
IdleGuardFailing (observability/rules.py) fires when the CronJob has had no successful run for a while.

Kubernetes reads it needs, cluster-wide: list pods, nodes and kubeflow.org pytorchjobs (terraform/stacks/platform).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from trainkit.backends.eks import cluster
from trainkit.backends.eks.idle_decision import (
    DEFAULT_STEP_S,
    DEFAULT_WINDOW_MINUTES,
    UTIL_METRIC,
    Decision,
    NodeGroup,
    Utilisation,
    decide,
)
from trainkit.backends.eks.idle_inputs import (
    PROMETHEUS_URL,
    gpu_nodes_gpus,
    list_activity,
    query_utilisation,
    rfc3339,
    timestamp,
)
from trainkit.backends.eks.kube import TIMEOUT_S, Kube, api_errors, connect_here, unless_missing
from trainkit.backends.eks.nodegroup import describe_group, scale_to
from trainkit.errors import SpecError
from trainkit.plan.prices import PriceBook, plan_region

STATUS_KEYS = (
    "checked_at",
    "decision",
    "reason",
    "window_minutes",
    "nodegroup",
    "desired_size",
    "scaled_down_at",
    "missing_data_since",
    "unschedulable",
)

# ---------------------------------------------------------------- recording


def read_status(kube: Kube, namespace: str = cluster.PLATFORM_NAMESPACE) -> dict | None:
    """The guard's last record, or None when it has never run (or is not installed)."""
    found = unless_missing(kube.core.read_namespaced_config_map, cluster.IDLE_GUARD, namespace)
    return dict(found.data or {}) if found is not None else None


def write_status(kube: Kube, namespace: str, data: dict) -> dict:
    """Create the status ConfigMap, or replace it (a ConfigMap allows an update without a resourceVersion)."""
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": cluster.IDLE_GUARD, "namespace": namespace, "labels": {**cluster.GUARD_LABELS}},
        "data": {key: str(data[key]) for key in STATUS_KEYS if data.get(key) is not None},
    }
    api_error, _ = api_errors()
    try:
        return kube.core.replace_namespaced_config_map(cluster.IDLE_GUARD, namespace, body, _request_timeout=TIMEOUT_S)
    except api_error as error:
        if error.status != 404:
            raise
        return kube.core.create_namespaced_config_map(namespace, body, _request_timeout=TIMEOUT_S)


def record_event(
    kube: Kube, namespace: str, status_map, now: float, reason: str, message: str, kind: str = "Normal", index: int = 0
) -> None:
    """A core/v1 Event on the status ConfigMap, as `kubectl get events` lists it; `kind` Normal or Warning, `index`
    tells apart the Events of one run."""
    meta = status_map.metadata
    at = timestamp(now)
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{cluster.IDLE_GUARD}.{int(now * 1000):x}.{index}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": meta.name,
            "namespace": namespace,
            "uid": meta.uid,
        },
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": cluster.IDLE_GUARD},
        "reportingComponent": cluster.IDLE_GUARD,
        "reportingInstance": os.environ.get("HOSTNAME", cluster.IDLE_GUARD),
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
    }
    kube.core.create_namespaced_event(namespace, body, _request_timeout=TIMEOUT_S)


# ---------------------------------------------------------------- what `invoke status` says


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def describe(kube: Kube, infra) -> list[str]:
    """`invoke status` lines: the guard's last record and what the GPU nodes up now cost per hour."""
    nodes = kube.core.list_node(label_selector="trainkit/pool=gpu", _request_timeout=TIMEOUT_S).items
    types = [(n.metadata.labels or {}).get("node.kubernetes.io/instance-type", "?") for n in nodes]
    book = PriceBook(plan_region(infra.region))
    prices = [book.instance_hour("eks", t) for t in types] if nodes else []
    if not nodes:
        cost = "GPU nodes up: none ($0/h)"
    elif None in prices:
        unpriced = ", ".join(sorted(set(types)))
        cost = f"GPU nodes up: {len(nodes)} ({unpriced}; no price known: `invoke infra.prices` says why)"
    else:
        sources = ", ".join(sorted({p.source for p in prices}))
        cost = (
            f"GPU nodes up: {len(nodes)} x {', '.join(sorted(set(types)))}, about ${sum(p.usd for p in prices):,.2f}/h "
            f"(on-demand, {sources})"
        )
    if not infra.idle_guard:
        return [
            cost,
            "idle guard: off, so nodes stay up until the group is scaled to 0 (idle_guard_minutes = 30 in "
            "terraform/stacks/infra/terraform.tfvars and `make up PROFILE=aws` turn it on)",
        ]
    record = read_status(kube)
    window = infra.idle_guard.get("window_minutes")
    if record is None:
        return [cost, f"idle guard: on ({window} min window), no run recorded yet (its CronJob runs every 5 min)"]
    last = f"; scaled to zero at {record['scaled_down_at']}" if record.get("scaled_down_at") else ""
    lines = [
        cost,
        f"idle guard: on ({window} min window); last check {record.get('checked_at')}: {record.get('decision')}, "
        f"{record.get('reason')}{last}",
    ]
    if record.get("missing_data_since") and record.get("checked_at"):
        missing = rfc3339(record["checked_at"]) - rfc3339(record["missing_data_since"])
        lines.append(
            f"idle guard: no utilisation data for {_duration(missing)} while {len(nodes)} GPU node(s) are up "
            f"(since {record['missing_data_since']}): the guard keeps them until {UTIL_METRIC} reports again; check "
            "the GPU nodes' dcgm-exporter pods and Prometheus's dcgm target"
        )
    return lines


# ---------------------------------------------------------------- one run


@dataclass
class GuardSettings:
    cluster_name: str
    nodegroup: str
    window_s: float = DEFAULT_WINDOW_MINUTES * 60
    step_s: float = DEFAULT_STEP_S
    prometheus: str = PROMETHEUS_URL
    status_namespace: str = cluster.PLATFORM_NAMESPACE
    dry_run: bool = False

    def __post_init__(self):
        if not self.window_s > 0 or not self.step_s > 0:
            raise SpecError(
                f"--window-minutes and --step-seconds must be positive (got {self.window_s / 60:g} min, "
                f"{self.step_s:g} s)"
            )
        if self.step_s > self.window_s:
            raise SpecError(f"--step-seconds {self.step_s:g} is longer than the window ({self.window_s:g} s)")


MISSING_DATA_ALERT_S = 3600
"""A keep for want of utilisation data that lasts longer than this while the group has nodes fails the guard's
runs, so the alert IdleGuardFailing (observability/rules.py) fires: nodes that never joined, an exporter that
restarts within every hour or a GPU that fell off the bus keep the nodes so, and GpuUtilisationMissing (a node's GPU
capacity without data for an hour) sees none of them."""


def missing_data_alarm(
    settings: GuardSettings, group: NodeGroup, decision: Decision, missing_s: float, utilisation: Utilisation
) -> str:
    """One line: for how long which data has been missing, and what to check."""
    if not utilisation.expected_gpus:
        check = (
            "check why no GPU node joined: `kubectl get nodes -l trainkit/pool=gpu`, and the node group's health "
            f"(`aws eks describe-nodegroup --cluster-name {settings.cluster_name} --nodegroup-name {group.name} "
            "--query nodegroup.health`: bootstrap, AMI or EFA failures show there)"
        )
    else:
        monitoring = cluster.MONITORING_NAMESPACE
        check = (
            f"check the dcgm-exporter pods (`kubectl -n {monitoring} get pods -o wide -l "
            f"app.kubernetes.io/name=dcgm-exporter`: one Running per GPU node, not restarting), its ServiceMonitor "
            f"(`kubectl -n {monitoring} get servicemonitor dcgm-exporter`) and that every GPU shows on its node "
            "(`kubectl get nodes -l trainkit/pool=gpu`, nvidia-smi)"
        )
    return (
        f"utilisation data missing for {_duration(missing_s)} while node group {group.name} asks for "
        f"{group.desired_size} node(s), which the guard keeps until it is back ({decision.reason}): {check}"
    )


def run_once(settings: GuardSettings, kube: Kube, eks, clock: Callable[[], float] = time.time) -> Decision:
    """Gather, decide, act, record. What uses the GPUs is listed again just before a scale-down, so a job submitted
    while the guard was deciding keeps its nodes."""
    now = clock()
    window = settings.window_s
    group = describe_group(eks, settings.cluster_name, settings.nodegroup)
    jobs = list_activity(kube, group)
    utilisation = query_utilisation(settings.prometheus, now, window, settings.step_s, gpu_nodes_gpus(kube))
    decision = decide(now, window, jobs, utilisation, group)
    if decision.scale_down and any(job.counts(now, window) for job in list_activity(kube, group)):
        decision = Decision("a job was submitted while the guard decided")
    previous = read_status(kube, settings.status_namespace) or {}
    stuck = [job for job in jobs if job.stuck(now, window)]
    if decision.desired is None:
        state = "keep"
    elif settings.dry_run:
        state = "would-scale-down" if decision.scale_down else "would-scale-up"
    else:
        state = "scaled-down" if decision.scale_down else "scaled-up"
    record = {
        "checked_at": timestamp(now),
        "decision": state,
        "reason": decision.reason,
        "window_minutes": f"{window / 60:g}",
        "nodegroup": settings.nodegroup,
        "desired_size": group.desired_size,
        "scaled_down_at": previous.get("scaled_down_at"),
        "missing_data_since": (previous.get("missing_data_since") or timestamp(now)) if decision.missing_data else None,
        "unschedulable": ", ".join(job.name for job in stuck) or None,
    }
    events = []
    if decision.missing_data and group.desired_size > 0:
        missing = now - rfc3339(record["missing_data_since"])
        if missing > MISSING_DATA_ALERT_S:
            decision = replace(decision, alarm=missing_data_alarm(settings, group, decision, missing, utilisation))
            events.append(("UtilisationDataMissing", decision.alarm, "Warning"))
    if decision.desired is not None and not settings.dry_run:
        scale_to(eks, settings.cluster_name, group, decision.desired)
        record["desired_size"] = decision.desired
        if decision.scale_down:
            record["scaled_down_at"] = timestamp(now)
        events.append(("ScaledToZero" if decision.scale_down else "ScaledUp", decision.reason, "Normal"))
    noted = set((previous.get("unschedulable") or "").split(", "))
    for job in stuck:
        if job.name not in noted:  # once per job: later runs say it in their reason
            what, since = job.blocked()
            message = (
                f"{job.name} has been {what} for {(now - since) / 60:.1f} min, longer than the {window / 60:g} min "
                f"window: it no longer keeps node group {group.name} up nor scales it; see why with `kubectl "
                "describe` on its pods (or on it, without pods), then fix what it asks for (instance type, GPUs, node "
                "count at most the group's maxSize, its image, the Secrets and ConfigMaps it names) or delete it"
            )
            events.append(("UnschedulableNotCounted", message, "Warning"))
    status_map = write_status(kube, settings.status_namespace, record)
    for index, (reason, message, kind) in enumerate(events):
        record_event(kube, settings.status_namespace, status_map, now, reason, message, kind, index)
    return decision


def failure(error: Exception) -> str | None:
    """One line for what a run could not get past, or None for anything else (a bug: its traceback is what to
    read). Either way the run exits non-zero, so the CronJob's Job fails and IdleGuardFailing (observability/
    rules.py) sees it."""
    from botocore.exceptions import BotoCoreError, ClientError

    api_error, connection_error = api_errors()
    if isinstance(error, SpecError):
        return str(error)
    if isinstance(error, ClientError):
        found = error.response.get("Error", {})
        return (
            f"EKS {error.operation_name} failed: {found.get('Code')}: {found.get('Message')} (check --cluster, "
            "--nodegroup and --region, and the guard's Pod Identity role in terraform/modules/gpu-nodegroup)"
        )
    if isinstance(error, BotoCoreError):
        return f"AWS: {error} (in the cluster the guard's credentials come from its Pod Identity association)"
    if isinstance(error, api_error):
        try:
            message = json.loads(error.body or "{}").get("message") or error.reason
        except ValueError:
            message = error.reason
        return (
            f"the Kubernetes API refused a request (HTTP {error.status}): {message} (the guard's Roles are in "
            "terraform/stacks/platform)"
        )
    if isinstance(error, connection_error):
        return f"cannot reach the Kubernetes API ({type(error).__name__}: {error})"
    return None


def main(argv: list[str] | None = None, clock: Callable[[], float] = time.time) -> int:
    """Exit 0 when it decided (one line: keep, scale down or scale up, and why), 1 when it could not check or act,
    or has kept the nodes for want of data for too long (one line on stderr), 2 on bad arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m trainkit.backends.eks.idle_guard", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--cluster", required=True, help="EKS cluster name")
    parser.add_argument(
        "--nodegroup", required=True, help="the GPU node group to scale (to zero when idle, up when a job waits)"
    )
    parser.add_argument("--region", default=None, help="AWS region (default: the environment's)")
    parser.add_argument("--window-minutes", type=float, default=DEFAULT_WINDOW_MINUTES, help="idle window")
    parser.add_argument("--step-seconds", type=float, default=DEFAULT_STEP_S, help="utilisation query resolution")
    parser.add_argument("--prometheus", default=PROMETHEUS_URL, help="Prometheus base URL")
    parser.add_argument("--dry-run", action="store_true", help="decide and record, change nothing")
    args = parser.parse_args(argv)
    try:
        settings = GuardSettings(
            args.cluster,
            args.nodegroup,
            args.window_minutes * 60,
            args.step_seconds,
            args.prometheus,
            dry_run=args.dry_run,
        )
    except SpecError as error:
        parser.error(str(error))
    try:
        import boto3

        decision = run_once(settings, connect_here(), boto3.client("eks", region_name=args.region), clock)
    except Exception as error:
        line = failure(error)
        if line is None:
            raise
        print(f"idle guard: failed: {line}", file=sys.stderr, flush=True)
        return 1
    if decision.alarm:  # fails the Job, so IdleGuardFailing fires
        print(f"idle guard: keep, failing: {decision.alarm}", file=sys.stderr, flush=True)
        return 1
    action = "keep" if decision.desired is None else "scale down" if decision.scale_down else "scale up"
    print(f"idle guard: {action}: {decision.reason}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
