"""What the idle guard reads (trainkit/backends/eks/idle_guard.py): what uses or waits for the GPU nodes, in every
namespace (PyTorchJobs and pods that request nvidia.com/gpu), the GPUs the GPU nodes have, and their utilisation
over the window from the platform's Prometheus."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime

from trainkit import hardware
from trainkit.backends.eks import cluster
from trainkit.backends.eks.idle_decision import (
    GPU_KEY,
    UTIL_METRIC,
    GpuSeries,
    JobSeen,
    NodeGroup,
    PodSeen,
    Utilisation,
    nodes_for,
)
from trainkit.backends.eks.kube import GROUP, PLURAL, TIMEOUT_S, VERSION, Kube
from trainkit.errors import SpecError

PROMETHEUS_URL = f"http://{cluster.MONITORING_RELEASE}-prometheus.{cluster.MONITORING_NAMESPACE}.svc:9090"
"""kube-prometheus-stack 88.5.3 names its Prometheus Service `<release>-prometheus` (templates/prometheus/service.yaml,
`kube-prometheus-stack.fullname`-prometheus; the release name already holds the chart's), port 9090."""
GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource NVIDIA's device plugin advertises (NVIDIA/k8s-device-plugin, the resource name it
registers); an extended resource is a whole number, so any quantity but "0" asks for GPUs."""
EFA_RESOURCE = "vpc.amazonaws.com/efa"
"""The EFA devices AWS's EFA device plugin advertises (aws-efa-k8s-device-plugin); trainkit's workers ask for all of a
node's (trainkit/backends/eks/render.py)."""
STUCK_WAITING = (
    "ImagePullBackOff",
    "ErrImagePull",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
)
"""Waiting reasons of a container that the kubelet retries with no end in sight: its image cannot be pulled or named
(pkg/kubelet/images/types.go ErrImagePullBackOff, ErrImagePull, ErrImageNeverPull, ErrInvalidImageName) or its
config not made, e.g. a Secret or ConfigMap it names is missing (pkg/kubelet/kuberuntime/kuberuntime_container.go
ErrCreateContainerConfig). A pod left so for longer than the window holds its node and uses none of it."""
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
"""Training-operator v1.9.4 labels each pod of a job with its job's name (pkg/apis/kubeflow.org/v1/common_types.go
JobNameLabel)."""
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
"""The well-known node label a pod's nodeSelector names an instance type with (k8s.io/api core/v1
well_known_labels.go LabelInstanceTypeStable); EKS sets it on every node."""
TERMINAL_PHASES = ("Succeeded", "Failed")
"""A pod in either phase has ended for good: all its containers terminated and none will restart (k8s.io/api
core/v1 types.go PodSucceeded, PodFailed); it holds no GPU."""


def rfc3339(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def timestamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ended_at(job: dict) -> float | None:
    """Training-operator v1.9.4 sets Succeeded or Failed (status True) when a job ends (pkg/util/status.go); its
    lastTransitionTime is when. Anything else (Created, Running, Restarting, no status yet) has not ended: None."""
    ended = [
        condition
        for condition in job.get("status", {}).get("conditions", [])
        if condition.get("type") in ("Succeeded", "Failed") and condition.get("status") == "True"
    ]
    if not ended:
        return None
    return max(rfc3339(c["lastTransitionTime"]) for c in ended if c.get("lastTransitionTime"))


def pod_requests(pod_spec: dict, resource: str) -> int:
    """How many of an extended resource a pod asks for: its containers' sum, or an init container's if that is
    more (they run one at a time before the others), each container's request or, given alone, its limit, which
    is then its request too (k8s.io/api core/v1 types.go ResourceRequirements; an extended resource is whole)."""

    def asked(container: dict) -> int:
        resources = container.get("resources") or {}
        return max(int(str((resources.get(part) or {}).get(resource, 0))) for part in ("requests", "limits"))

    init = [asked(container) for container in pod_spec.get("initContainers") or []]
    return max(sum(asked(container) for container in pod_spec.get("containers") or []), *init, 0)


def requests_gpus(pod_spec: dict) -> bool:
    """Whether any container or init container of a pod spec requests or limits nvidia.com/gpu."""
    return pod_requests(pod_spec, GPU_RESOURCE) > 0


def node_gpus(pod_spec: dict, group: NodeGroup) -> int:
    """The GPUs a pod asks of the group's nodes, or a whole node's when it asks for all of a node's GPUs or EFA
    devices (as trainkit's workers do): no other GPU pod fits beside it."""
    gpus, instance = pod_requests(pod_spec, GPU_RESOURCE), group.instance
    efa = instance.efa_interfaces if instance else 0
    whole = gpus >= group.gpus_per_node or (efa and pod_requests(pod_spec, EFA_RESOURCE) >= efa)
    return max(gpus, group.gpus_per_node) if whole else gpus


def fits_group(pod_spec: dict, group: NodeGroup) -> bool:
    """False when the pod's nodeSelector names an instance type the group does not have: kube-scheduler places a
    pod only on nodes whose labels match all of its nodeSelector (the NodeAffinity filter plugin,
    pkg/scheduler/framework/plugins/nodeaffinity), so such a pod never runs on this group's nodes."""
    wanted = (pod_spec.get("nodeSelector") or {}).get(INSTANCE_TYPE_LABEL)
    return wanted is None or not group.instance_types or wanted in group.instance_types


def unschedulable_since(pod: dict) -> float | None:
    """When kube-scheduler last found no node for the pod: it sets the PodScheduled condition to False with reason
    Unschedulable (k8s.io/api core/v1 types.go PodReasonUnschedulable; pkg/scheduler/schedule_one.go
    handleSchedulingFailure), and lastTransitionTime stays while the pod stays unschedulable. None otherwise (placed,
    not tried yet, or held by scheduling gates, reason SchedulingGated)."""
    for condition in pod.get("status", {}).get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return rfc3339(condition.get("lastTransitionTime") or pod["metadata"]["creationTimestamp"])
    return None


def waiting_for_good(pod: dict) -> tuple[str, float] | None:
    """A bound pod with a container waiting for what the kubelet cannot get (STUCK_WAITING), and since when: its
    ContainersReady (or Ready) condition's last change to False, else its creation. None when none waits so."""
    status = pod.get("status", {})
    containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    reasons = [((c.get("state") or {}).get("waiting") or {}).get("reason") for c in containers]
    reason = next((r for r in reasons if r in STUCK_WAITING), None)
    if reason is None:
        return None
    unready = [
        c.get("lastTransitionTime")
        for c in status.get("conditions") or []
        if c.get("type") in ("ContainersReady", "Ready") and c.get("status") == "False"
    ]
    return f"in {reason}", rfc3339(next(filter(None, unready), None) or pod["metadata"]["creationTimestamp"])


def pod_seen(pod: dict, group: NodeGroup) -> PodSeen:
    gpus, node = node_gpus(pod["spec"], group), pod["spec"].get("nodeName") or None
    if node is None:
        return PodSeen(gpus, None, unschedulable_since(pod))
    blocked = waiting_for_good(pod)
    return PodSeen(gpus, node, blocked[1], blocked[0]) if blocked else PodSeen(gpus, node)


def replica_gpus(job: dict, group: NodeGroup, least: bool = False) -> list[int]:
    """What each replica of a PyTorchJob that runs on the group asks of it (node_gpus): all its replicas, or with
    `least` the fewest it runs with: an elastic job's elasticPolicy.minReplicas workers (training-operator v1.9.4
    pkg/apis/kubeflow.org/v1/pytorch_types.go ElasticPolicy, the lower limit its workers scale down to)."""
    spec = job.get("spec") or {}
    minimum = (spec.get("elasticPolicy") or {}).get("minReplicas")
    gpus = []
    for kind, replica in (spec.get("pytorchReplicaSpecs") or {}).items():
        template = replica.get("template", {}).get("spec") or {}
        if requests_gpus(template) and fits_group(template, group):
            count = int(replica.get("replicas", 1))
            if least and kind == "Worker" and minimum is not None:
                count = min(count, int(minimum))
            gpus += [node_gpus(template, group)] * count
    return gpus


def podless_since(job: dict) -> float | None:
    """Since when a job without pods has had none: its creation or its latest condition change (the operator sets
    Created, Running, Restarting as it goes), whichever is later; None when neither is known."""
    meta, conditions = job["metadata"], job.get("status", {}).get("conditions") or []
    stamps = [meta.get("creationTimestamp"), *(c.get("lastTransitionTime") for c in conditions)]
    return max((rfc3339(stamp) for stamp in stamps if stamp), default=None)


def daemon(pod: dict) -> bool:
    """A DaemonSet's pod runs on every node it matches for as long as the node is there (k8s.io/api apps/v1
    DaemonSet), so it is part of the nodes, not a use of them: were it activity, it would keep them forever."""
    return any(ref.get("kind") == "DaemonSet" for ref in pod["metadata"].get("ownerReferences") or [])


def activity(jobs: list[dict], pods: list[dict], group: NodeGroup) -> list[JobSeen]:
    """What uses or waits for the group's GPU nodes: each PyTorchJob whose replicas request GPUs, with the pods of it
    that have not ended and what its replicas without a pod ask for, and each other pod that requests GPUs and has
    not ended, but a DaemonSet's. A job's pods after it ended stand alone: whatever still runs is activity until it
    ends."""
    live = [
        pod
        for pod in pods
        if pod.get("status", {}).get("phase") not in TERMINAL_PHASES
        and requests_gpus(pod["spec"])
        and fits_group(pod["spec"], group)
        and not daemon(pod)
    ]
    seen, folded = [], set()
    for job in jobs:
        meta = job["metadata"]
        wanted = replica_gpus(job, group)
        if not wanted:
            continue
        ended = ended_at(job)
        own = [
            pod
            for pod in live
            if ended is None
            and pod["metadata"]["namespace"] == meta["namespace"]
            and (pod["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) == meta["name"]
        ]
        folded.update(id(pod) for pod in own)
        pods_seen = tuple(pod_seen(pod, group) for pod in own)
        for pod in pods_seen:  # what its replicas ask for, less what its pods do
            if pod.gpus in wanted:
                wanted.remove(pod.gpus)
        minimum = nodes_for(replica_gpus(job, group, least=True), group.gpus_per_node)
        since = None if own or ended is not None else podless_since(job)
        name = f"PyTorchJob {meta['namespace']}/{meta['name']}"
        seen.append(JobSeen(name, ended, pods_seen, tuple(wanted) if ended is None else (), since, minimum))
    for pod in live:
        if id(pod) not in folded:
            meta = pod["metadata"]
            seen.append(JobSeen(f"pod {meta['namespace']}/{meta['name']}", None, (pod_seen(pod, group),)))
    return seen


def list_activity(kube: Kube, group: NodeGroup) -> list[JobSeen]:
    """PyTorchJobs and pods of every namespace (`--namespace` is a user's choice, and notebooks, plain Jobs and pods
    use GPUs too), read as the API serves them."""
    jobs = kube.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=TIMEOUT_S)["items"]
    response = kube.core.list_pod_for_all_namespaces(_request_timeout=TIMEOUT_S, _preload_content=False)
    return activity(jobs, json.loads(response.data)["items"], group)


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
