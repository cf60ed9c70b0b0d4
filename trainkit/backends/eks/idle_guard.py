"""The idle-cluster guard: scale the GPU node group to zero when nothing has used it for a window.

    python -m trainkit.backends.eks.idle_guard --cluster trainkit --nodegroup gpu --region us-east-1

The platform stack runs this as a CronJob (opt-in: the infra stack's idle_guard_minutes) in the training image,
under a Pod Identity role whose only write is this node group's UpdateNodegroupConfig (terraform/modules/
gpu-nodegroup). Each run gathers three things, then `decide` (pure) says scale down or keep, and why:
- trainkit's PyTorchJobs: one that has not ended, or that ended within the window, is activity;
- DCGM_FI_DEV_GPU_UTIL of every GPU over the window, from the platform's Prometheus: every GPU the GPU nodes
  have must report for the whole window and stay below IDLE_PERCENT; no series, a series with gaps or fewer GPUs
  reporting than the nodes have all count as activity (no data never scales anything down);
- the node group (EKS DescribeNodegroup): already at zero, or changing, is left alone.
What it found and did goes into the ConfigMap `trainkit-idle-guard` (trainkit-system), which `invoke status`
reads, and a scale-down also into a Kubernetes Event on that ConfigMap (`kubectl get events -n trainkit-system`).
A run that cannot check or act exits 1 with one line on why, so its Job fails; the alert IdleGuardFailing
(observability/rules.py) fires when the CronJob has had no successful run for a while.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from trainkit import hardware
from trainkit.backends.eks import cluster
from trainkit.backends.eks.idle_decision import (
    DEFAULT_STEP_S,
    DEFAULT_WINDOW_MINUTES,
    GPU_KEY,
    UTIL_METRIC,
    Decision,
    GpuSeries,
    JobSeen,
    NodeGroup,
    Utilisation,
    decide,
)
from trainkit.backends.eks.kube import GROUP, PLURAL, TIMEOUT_S, VERSION, Kube, api_errors, unless_missing
from trainkit.backends.eks.render import MANAGED_BY
from trainkit.errors import SpecError

PROMETHEUS_URL = f"http://{cluster.MONITORING_RELEASE}-prometheus.{cluster.MONITORING_NAMESPACE}.svc:9090"
"""kube-prometheus-stack 88.5.3 names its Prometheus Service `<release>-prometheus` (templates/prometheus/service.yaml,
`kube-prometheus-stack.fullname`-prometheus; the release name already holds the chart's), port 9090."""
STATUS_KEYS = ("checked_at", "decision", "reason", "window_minutes", "nodegroup", "desired_size", "scaled_down_at")

# ---------------------------------------------------------------- gathering the inputs


def rfc3339(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def timestamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def job_seen(job: dict) -> JobSeen:
    """Training-operator v1.9.4 sets Succeeded or Failed (status True) when a job ends (pkg/util/status.go); its
    lastTransitionTime is when. Anything else (Created, Running, Restarting, no status yet) has not ended."""
    ended = [
        condition
        for condition in job.get("status", {}).get("conditions", [])
        if condition.get("type") in ("Succeeded", "Failed") and condition.get("status") == "True"
    ]
    name = job["metadata"]["name"]
    if not ended:
        return JobSeen(name, None)
    return JobSeen(name, max(rfc3339(c["lastTransitionTime"]) for c in ended if c.get("lastTransitionTime")))


def list_jobs(kube: Kube, namespace: str) -> list[JobSeen]:
    selector = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
    items = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector=selector, _request_timeout=TIMEOUT_S
    )["items"]
    return [job_seen(job) for job in items]


def gpu_nodes_gpus(kube: Kube) -> int:
    """GPUs the GPU nodes have (the node group labels them trainkit/pool=gpu): the instance type's count from the
    instance table, else what the node's device plugin made allocatable."""
    nodes = kube.core.list_node(label_selector="trainkit/pool=gpu", _request_timeout=TIMEOUT_S).items
    total = 0
    for node in nodes:
        instance = hardware.INSTANCE_TYPES.get((node.metadata.labels or {}).get("node.kubernetes.io/instance-type"))
        total += instance.gpus if instance else int((node.status.allocatable or {}).get("nvidia.com/gpu", 0))
    return total


def utilisation_query(step_s: float) -> str:
    """Per GPU, the max over the step before each point (PromQL durations are whole milliseconds at least)."""
    step = max(1, round(step_s * 1000))
    return f"max by ({', '.join(GPU_KEY)}) (max_over_time({UTIL_METRIC}[{step}ms]))"


def query_utilisation(prometheus: str, now: float, window_s: float, step_s: float, expected_gpus: int) -> Utilisation:
    """Prometheus's range API (/api/v1/query_range): per GPU, the max utilisation over each step of the window."""
    start = now - window_s
    query = utilisation_query(step_s)
    params = urllib.parse.urlencode(
        {"query": query, "start": f"{start:.3f}", "end": f"{now:.3f}", "step": f"{step_s:g}"}
    )
    url = f"{prometheus.rstrip('/')}/api/v1/query_range?{params}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as error:  # Prometheus explains a refused query in the body
        body = json.loads(error.read() or b"{}")
    except OSError as error:
        raise SpecError(f"cannot query Prometheus at {prometheus} ({error}); nothing was changed") from None
    if body.get("status") != "success":
        raise SpecError(f"Prometheus refused the utilisation query: {body.get('error', body)}")
    series = tuple(
        GpuSeries(
            {key: result["metric"].get(key, "") for key in GPU_KEY},
            tuple((float(t), float(v)) for t, v in result["values"]),
        )
        for result in body["data"]["result"]
    )
    return Utilisation(series, start, now, step_s, expected_gpus)


def describe_group(eks, cluster_name: str, nodegroup: str) -> NodeGroup:
    found = eks.describe_nodegroup(clusterName=cluster_name, nodegroupName=nodegroup)["nodegroup"]
    scaling = found["scalingConfig"]
    return NodeGroup(nodegroup, found["status"], scaling["minSize"], scaling["maxSize"], scaling["desiredSize"])


def scale_to(eks, cluster_name: str, group: NodeGroup, desired: int) -> dict:
    """UpdateNodegroupConfig with the whole scalingConfig (min and max as they are), so only the desired size
    changes; EKS refuses a desired size outside [minSize, maxSize]."""
    return eks.update_nodegroup_config(
        clusterName=cluster_name,
        nodegroupName=group.name,
        scalingConfig={"minSize": group.min_size, "maxSize": group.max_size, "desiredSize": desired},
    )["update"]


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


def record_event(kube: Kube, namespace: str, status_map, now: float, reason: str, message: str) -> None:
    """A core/v1 Event on the status ConfigMap, as `kubectl get events` lists it."""
    meta = status_map.metadata
    at = timestamp(now)
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{cluster.IDLE_GUARD}.{int(now * 1000):x}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": meta.name,
            "namespace": namespace,
            "uid": meta.uid,
        },
        "reason": reason,
        "message": message,
        "type": "Normal",
        "source": {"component": cluster.IDLE_GUARD},
        "reportingComponent": cluster.IDLE_GUARD,
        "reportingInstance": os.environ.get("HOSTNAME", cluster.IDLE_GUARD),
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
    }
    kube.core.create_namespaced_event(namespace, body, _request_timeout=TIMEOUT_S)


# ---------------------------------------------------------------- the launcher's side


def wake(infra, nodes: int, eks=None) -> str | None:
    """Before a submit: a node group the guard scaled to zero gets `nodes` (at most its maxSize) back. Returns a
    note when it did, None when the guard is off or the group has nodes."""
    guard = infra.idle_guard
    if not guard:
        return None
    if eks is None:
        import boto3

        eks = boto3.client("eks", region_name=guard["region"])
    group = describe_group(eks, guard["cluster_name"], guard["nodegroup"])
    if group.desired_size > 0:
        return None
    desired = max(group.min_size, min(nodes, group.max_size))
    scale_to(eks, guard["cluster_name"], group, desired)
    return (
        f"the idle guard had scaled node group {group.name} to zero: asked for {desired} node(s) again; the job "
        "stays Pending until they join (10 to 15 minutes)"
    )


def describe(kube: Kube, infra) -> list[str]:
    """`invoke status` lines: the guard's last record and what the GPU nodes up now cost per hour."""
    nodes = kube.core.list_node(label_selector="trainkit/pool=gpu", _request_timeout=TIMEOUT_S).items
    types = [(n.metadata.labels or {}).get("node.kubernetes.io/instance-type", "?") for n in nodes]
    prices = [hardware.ON_DEMAND_USD_PER_HOUR.get(t) for t in types]
    if not nodes:
        cost = "GPU nodes up: none ($0/h)"
    elif None in prices:
        cost = f"GPU nodes up: {len(nodes)} ({', '.join(sorted(set(types)))}; no price in trainkit/hardware.py)"
    else:
        cost = (
            f"GPU nodes up: {len(nodes)} x {', '.join(sorted(set(types)))}, about ${sum(prices):,.2f}/h "
            f"(on-demand us-east-1, {hardware.PRICE_TABLE_AS_OF})"
        )
    if not infra.idle_guard:
        return [cost, "idle guard: off (set idle_guard_minutes in terraform/stacks/infra/terraform.tfvars)"]
    record = read_status(kube)
    window = infra.idle_guard.get("window_minutes")
    if record is None:
        return [cost, f"idle guard: on ({window} min window), no run recorded yet (its CronJob runs every 5 min)"]
    last = f"; scaled to zero at {record['scaled_down_at']}" if record.get("scaled_down_at") else ""
    return [
        cost,
        f"idle guard: on ({window} min window); last check {record.get('checked_at')}: {record.get('decision')}, "
        f"{record.get('reason')}{last}",
    ]


# ---------------------------------------------------------------- one run


@dataclass
class GuardSettings:
    cluster_name: str
    nodegroup: str
    window_s: float = DEFAULT_WINDOW_MINUTES * 60
    step_s: float = DEFAULT_STEP_S
    prometheus: str = PROMETHEUS_URL
    jobs_namespace: str = cluster.JOBS_NAMESPACE
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


def run_once(settings: GuardSettings, kube: Kube, eks, clock: Callable[[], float] = time.time) -> Decision:
    """Gather, decide, act, record. The jobs are listed again just before a scale-down, so a job submitted while
    the guard was deciding keeps its nodes."""
    now = clock()
    group = describe_group(eks, settings.cluster_name, settings.nodegroup)
    jobs = list_jobs(kube, settings.jobs_namespace)
    utilisation = query_utilisation(settings.prometheus, now, settings.window_s, settings.step_s, gpu_nodes_gpus(kube))
    decision = decide(now, settings.window_s, jobs, utilisation, group)
    if decision.scale_down and any(job.ended_at is None for job in list_jobs(kube, settings.jobs_namespace)):
        decision = Decision(False, "a job was submitted while the guard decided")
    previous = read_status(kube, settings.status_namespace) or {}
    record = {
        "checked_at": timestamp(now),
        "decision": "keep",
        "reason": decision.reason,
        "window_minutes": f"{settings.window_s / 60:g}",
        "nodegroup": settings.nodegroup,
        "desired_size": group.desired_size,
        "scaled_down_at": previous.get("scaled_down_at"),
    }
    if decision.scale_down and settings.dry_run:
        record["decision"] = "would-scale-down"
    elif decision.scale_down:
        scale_to(eks, settings.cluster_name, group, 0)
        record.update(decision="scaled-down", desired_size=0, scaled_down_at=timestamp(now))
    status_map = write_status(kube, settings.status_namespace, record)
    if record["decision"] == "scaled-down":
        record_event(kube, settings.status_namespace, status_map, now, "ScaledToZero", decision.reason)
    return decision


def connect() -> Kube:
    """In a pod, its service account (KUBERNETES_SERVICE_HOST is set there); elsewhere the kubeconfig."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return Kube.connect()
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    api = client.ApiClient(configuration)
    return Kube(client.CoreV1Api(api), client.CustomObjectsApi(api), client.VersionApi(api), configuration.host)


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
    """Exit 0 when it decided (one line: keep or scale down, and why), 1 when it could not check or act (one line
    on stderr), 2 on bad arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m trainkit.backends.eks.idle_guard", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--cluster", required=True, help="EKS cluster name")
    parser.add_argument("--nodegroup", required=True, help="the GPU node group to scale to zero when idle")
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

        decision = run_once(settings, connect(), boto3.client("eks", region_name=args.region), clock)
    except Exception as error:
        line = failure(error)
        if line is None:
            raise
        print(f"idle guard: failed: {line}", file=sys.stderr, flush=True)
        return 1
    print(f"idle guard: {'scale down' if decision.scale_down else 'keep'}: {decision.reason}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
