"""What the idle guard's tests run against: a stand-in for dcgm-exporter that serves DCGM_FI_DEV_GPU_UTIL for one
node's GPUs, moto's EKS with a GPU node group (each request checked against botocore's model, sizes as EKS checks
them), and the Kubernetes test API server (tests/helpers/kube_api.py) with the two calls the guard makes beyond the
EKS backend's.

dcgm-exporter 4.8.2's rules for this series (observability/contract.py cites them): a gauge per GPU with the labels
GPU_LABELS in that order; a GPU that a pod holds also carries the pod's namespace, pod and container, so its series
changes when a job starts or ends; a node without the exporter serves nothing at all.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlparse

import kubernetes_validate
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily

from observability.contract import GPU_LABELS, GPU_METRICS, NODE_LABEL, POD_LABELS
from tests.helpers.aws_model import problems
from tests.helpers.containers import free_port
from tests.helpers.kube_api import FakeCluster, now, status_body
from tests.helpers.kubernetes import kubernetes_version

UTIL = "DCGM_FI_DEV_GPU_UTIL"
NODE = "ip-10-0-0-1.ec2.internal"  # FakeCluster.add_nodes' first node name
EVENTS = re.compile(r"^/api/v1/namespaces/([^/]+)/events$")
CONFIGMAP = re.compile(r"^/api/v1/namespaces/([^/]+)/configmaps/([^/]+)$")


class DcgmStandIn:
    """`gpus` GPUs of node NODE; `util[gpu]` is served as that GPU's percentage, `held[gpu]` (namespace, pod,
    container) adds the pod labels; `serving = False` serves no series (the exporter gone with its node)."""

    def __init__(self, gpus: int = 8):
        self.util = dict.fromkeys(range(gpus), 0.0)
        self.held: dict[int, tuple[str, str, str]] = {}
        self.serving = True
        self.lock = threading.Lock()
        registry = CollectorRegistry()
        registry.register(self)
        self.port = free_port()
        self.server, self.thread = start_http_server(self.port, addr="127.0.0.1", registry=registry)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def labels(self, gpu: int) -> dict:
        by_name = {
            "gpu": str(gpu),
            "UUID": f"GPU-00000000-0000-0000-0000-00000000000{gpu}",
            "pci_bus_id": f"00000000:{0x53 + gpu:02X}:00.0",
            "device": f"nvidia{gpu}",
            "modelName": "NVIDIA H100 80GB HBM3",
            NODE_LABEL: NODE,
            "DCGM_FI_DRIVER_VERSION": "570.172.08",
        }
        return {name: by_name[name] for name in GPU_LABELS}

    def collect(self):
        with self.lock:
            if not self.serving:
                return
            held = {gpu: self.held.get(gpu) for gpu in self.util}
            values = dict(self.util)
        plain = GaugeMetricFamily(UTIL, GPU_METRICS[UTIL][0], labels=GPU_LABELS)
        allocated = GaugeMetricFamily(UTIL, GPU_METRICS[UTIL][0], labels=(*GPU_LABELS, *POD_LABELS))
        for gpu, value in values.items():
            labels = list(self.labels(gpu).values())
            if held[gpu]:
                allocated.add_metric([*labels, *held[gpu]], value)
            else:
                plain.add_metric(labels, value)
        # one family in the exposition, as dcgm-exporter writes it (HELP and TYPE once)
        plain.samples.extend(allocated.samples)
        yield plain

    def close(self) -> None:
        self.server.shutdown()


@dataclass
class GuardCluster(FakeCluster):
    """The test API server plus what only the guard asks of it, as the v1.33 API server does it:
    - PUT of a ConfigMap (update): the object is validated as on create; a ConfigMap may be updated without a
      resourceVersion (pkg/registry/core/configmap/strategy.go AllowUnconditionalUpdate); a missing one is 404;
    - POST of a core/v1 Event: validated (the v1.33 schema, strictly) and kept; a name taken is 409;
    - pods no process runs (`add_pod`): another team's GPU pods, or pods the scheduler could not place, served
      with the others by the pod lists."""

    events: list = field(default_factory=list)
    bare_pods: list = field(default_factory=list)

    def __post_init__(self):
        super().__post_init__()
        base, cluster = self.server.RequestHandlerClass, self

        class Handler(base):
            def _route(self, method: str) -> None:
                path = urlparse(self.path).path
                if method == "POST" and (m := EVENTS.match(path)):
                    return self._send(*cluster.create_event(m[1], self._body()))
                if method == "PUT" and (m := CONFIGMAP.match(path)):
                    return self._send(*cluster.replace_configmap(m[1], m[2], self._body()))
                return super()._route(method)

        self.server.RequestHandlerClass = Handler

    def _sync(self, namespace: str, name: str, job: dict) -> None:
        """Jobs here are put in the state the operator leaves them (add_job); no operator runs them."""

    def replace_configmap(self, namespace: str, name: str, body: dict):
        try:
            kubernetes_validate.validate(body, kubernetes_version(), strict=True)
        except kubernetes_validate.ValidationError as error:
            return 422, status_body(422, "Invalid", f"ConfigMap is invalid: {error}")
        if body["metadata"].get("name") != name:
            return 400, status_body(400, "BadRequest", "the name of the object does not match the name on the URL")
        with self.lock:
            old = self.configmaps.get((namespace, name))
            if old is None:
                return 404, status_body(404, "NotFound", f'configmaps "{name}" not found')
            body["metadata"].update(
                namespace=namespace, uid=old["metadata"]["uid"], creationTimestamp=old["metadata"]["creationTimestamp"]
            )
            self.configmaps[(namespace, name)] = body
        return 200, body

    def create_event(self, namespace: str, body: dict):
        try:
            kubernetes_validate.validate(body, kubernetes_version(), strict=True)
        except kubernetes_validate.ValidationError as error:
            return 422, status_body(422, "Invalid", f"Event is invalid: {error}")
        with self.lock:
            if any(e["metadata"]["name"] == body["metadata"]["name"] for e in self.events):
                return 409, status_body(409, "AlreadyExists", f'events "{body["metadata"]["name"]}" already exists')
            body["metadata"].update(namespace=namespace, creationTimestamp=now())
            self.events.append(body)
        return 201, body

    def served_pods(self) -> list[dict]:
        return [*super().served_pods(), *self.bare_pods]

    def add_job(self, name: str, conditions: list[dict], namespace: str = "trainkit-jobs", replicas: int = 1) -> None:
        """A trainkit PyTorchJob of `replicas` p5.48xlarge workers as the operator leaves it; no pods (add_pod
        adds them, labelled as the operator labels a job's pods)."""
        self.jobs[(namespace, name)] = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "trainkit"},
                "creationTimestamp": now(),
            },
            "spec": {
                "pytorchReplicaSpecs": {
                    "Worker": {"replicas": replicas, "restartPolicy": "ExitCode", "template": gpu_pod_spec(8)}
                }
            },
            "status": {"conditions": conditions},
        }

    def add_pod(
        self,
        namespace: str,
        name: str,
        gpus: int = 1,
        job: str | None = None,
        unschedulable_at: float | None = None,
        node: str = NODE,
    ) -> dict:
        """A pod that requests `gpus` nvidia.com/gpu (as a limit, as NVIDIA's examples give it), of PyTorchJob `job`
        if named; bound to `node` (the first node's name) and Running, or, with `unschedulable_at` (epoch seconds),
        Pending with the condition kube-scheduler sets when no node fits (pkg/scheduler/schedule_one.go
        handleSchedulingFailure: PodScheduled False, reason Unschedulable, its message)."""
        template = gpu_pod_spec(gpus, limits_only=True)
        labels = {"training.kubeflow.org/job-name": job, "training.kubeflow.org/replica-type": "worker"} if job else {}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "uid": f"uid-{name}"},
            "spec": template["spec"],
            "status": {"phase": "Pending" if unschedulable_at else "Running"},
        }
        if unschedulable_at is None:
            pod["spec"]["nodeName"] = node
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}]
        else:
            message = (
                f"0/{len(self.nodes)} nodes are available: {len(self.nodes)} Insufficient nvidia.com/gpu. "
                f"preemption: 0/{len(self.nodes)} nodes are available: {len(self.nodes)} No preemption victims "
                "found for incoming pod."
            )
            pod["status"]["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastProbeTime": None,
                    "lastTransitionTime": datetime.fromtimestamp(unschedulable_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            ]
        pod["metadata"]["creationTimestamp"] = now()
        kubernetes_validate.validate(pod, kubernetes_version(), strict=True)
        with self.lock:
            self.bare_pods.append(pod)
        return pod


def gpu_pod_spec(gpus: int, limits_only: bool = False) -> dict:
    """A pod template for the GPU nodes: trainkit's node selector and toleration, one container asking for `gpus`
    GPUs (requests and limits as trainkit renders them, or the limit alone)."""
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if not limits_only:
        resources["requests"] = {"nvidia.com/gpu": str(gpus)}
    return {
        "spec": {
            "nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge", "trainkit/pool": "gpu"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "registry.example.com/gpu:1", "resources": resources}],
        }
    }


def scaling_refusal(operation: str, scaling: dict) -> str | None:
    """What EKS answers (InvalidParameterException) to a scalingConfig outside minSize <= desiredSize <= maxSize,
    which moto 5 accepts: "desiredSize can't be greater than maxSize" (ministryofjustice/cloud-platform-
    infrastructure PR 4595), on update "Minimum capacity N can't be greater than desired size M"
    (terraform-aws-modules/terraform-aws-eks issues 2508 and 3306), on create "minSize can't be greater than
    desiredSize" (sassoftware/viya4-iac-aws issue 298). None when the sizes given are in order."""
    low, desired, high = (scaling.get(key) for key in ("minSize", "desiredSize", "maxSize"))
    if None not in (desired, high) and desired > high:
        return "desiredSize can't be greater than maxSize"
    if None not in (low, desired) and low > desired:
        if operation == "CreateNodegroup":
            return "minSize can't be greater than desiredSize"
        return f"Minimum capacity {low} can't be greater than desired size {desired}"
    return None


def checked_eks(moto) -> tuple[object, list]:
    """An EKS client on moto whose every request is first checked against botocore's model, and whose node group
    sizes are checked as EKS checks them (scaling_refusal); the list collects (operation, params) of each call."""
    from botocore.exceptions import ClientError

    eks = moto.client("eks")
    calls: list = []

    def check(params, model, **_):
        found = problems("eks", model.name, params)
        assert not found, f"{model.name}: {found}"
        calls.append((model.name, params))
        refusal = scaling_refusal(model.name, params.get("scalingConfig") or {})
        if refusal:
            error = {"Code": "InvalidParameterException", "Message": refusal}
            raise ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": 400}}, model.name)

    eks.meta.events.register("before-parameter-build.eks", check)
    return eks, calls


def gpu_nodegroup(eks, name: str, desired: int = 2, minimum: int = 0, maximum: int = 2) -> None:
    """A cluster `trainkit` (once) and a node group of p5.48xlarge like terraform/modules/gpu-nodegroup's."""
    if "trainkit" not in eks.list_clusters()["clusters"]:
        eks.create_cluster(
            name="trainkit",
            roleArn="arn:aws:iam::123456789012:role/cluster",
            resourcesVpcConfig={"subnetIds": ["subnet-0f9e8d7c6b5a40312"]},
        )
    eks.create_nodegroup(
        clusterName="trainkit",
        nodegroupName=name,
        scalingConfig={"minSize": minimum, "maxSize": maximum, "desiredSize": desired},
        subnets=["subnet-0f9e8d7c6b5a40312"],
        nodeRole="arn:aws:iam::123456789012:role/node",
        instanceTypes=["p5.48xlarge"],
        amiType="AL2023_x86_64_NVIDIA",
    )
