"""Kubernetes' own rules on what a pod asks for, written here from their source so that a test checks our rendering
against them rather than against itself: the API server's validation of a container's resources, the QoS class it
gives the pod, what the kubelet of an EKS AL2023 node makes allocatable, and whether the scheduler fits a pod there."""

from __future__ import annotations

from decimal import Decimal

from kubernetes.utils import parse_quantity

from trainkit import hardware

QOS_RESOURCES = ("cpu", "memory")  # pkg/apis/core/helper/qos/qos.go supportedQoSComputeResources


def native(name: str) -> bool:
    """pkg/apis/core/helper/helpers.go IsNativeResource: no domain, or kubernetes.io's."""
    return "/" not in name or "kubernetes.io/" in name


def overcommit_allowed(name: str) -> bool:
    """helpers.go IsOvercommitAllowed: native resources but hugepages; extended ones (nvidia.com/gpu) never."""
    return native(name) and not name.startswith("hugepages-")


def defaulted(resources: dict) -> tuple[dict, dict]:
    """(requests, limits) after pkg/apis/core/v1/defaults.go SetDefaults_Pod: a limit without a request is also the
    request."""
    limits = dict(resources.get("limits") or {})
    return {**limits, **(resources.get("requests") or {})}, limits


def resource_errors(container: dict) -> list[str]:
    """pkg/apis/core/validation/validation.go ValidateResourceRequirements, for the rules requests and limits meet."""
    requests, limits = defaulted(container.get("resources") or {})
    errors = []
    for name, quantity in requests.items():
        if name in limits:
            if not overcommit_allowed(name) and parse_quantity(quantity) != parse_quantity(limits[name]):
                errors.append(f"requests.{name}: must be equal to {name} limit")
            elif parse_quantity(quantity) > parse_quantity(limits[name]):
                errors.append(f"requests.{name}: must be less than or equal to {name} limit")
        elif not overcommit_allowed(name):
            errors.append(f"limits.{name}: Limit must be set for non overcommitable resources")
    hugepages = any(name.startswith("hugepages-") for name in {*requests, *limits})
    if hugepages and not any(name in QOS_RESOURCES for name in {*requests, *limits}):
        errors.append("resources: HugePages require cpu or memory")
    return errors


def qos_class(pod_spec: dict) -> str:
    """pkg/apis/core/helper/qos/qos.go ComputePodQOS (no pod-level resources): BestEffort when no container asks for
    CPU or memory; Guaranteed when every container (init ones too) has CPU and memory limits and the summed
    requests equal the summed limits; Burstable otherwise. Zero quantities count as absent."""
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    for container in [*(pod_spec.get("containers") or []), *(pod_spec.get("initContainers") or [])]:
        asked, limited = defaulted(container.get("resources") or {})
        for given, total in ((asked, requests), (limited, limits)):
            for name in QOS_RESOURCES:
                if name in given and parse_quantity(given[name]) > 0:
                    total[name] = total.get(name, Decimal(0)) + parse_quantity(given[name])
        if not all(name in limited and parse_quantity(limited[name]) > 0 for name in QOS_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests == limits:
        return "Guaranteed"
    return "Burstable"


# The node as the EKS AL2023 NVIDIA AMI's kubelet reports it. awslabs/amazon-eks-ami nodeadm/internal/kubelet/
# config.go: kubeReserved cpu from getCPUMillicoresToReserve, memory 11 x maxPods + 255 MiB, evictionHard
# memory.available 100Mi, no systemReserved; maxPods from nodeadm/internal/kubelet/eni-max-pods.txt.
MAX_PODS = {"p4d.24xlarge": 737, "p4de.24xlarge": 737, "p5.48xlarge": 100, "p5e.48xlarge": 100, "p5en.48xlarge": 198}
MIB = 2**20
# EKS User Guide, node-efa: instances with the EFA driver pre-allocate 5128 2 MiB hugepages.
NODE_HUGEPAGES = 5128 * 2 * MIB
# The kernel's MemTotal is below the published memory; Karpenter assumes 7.5% less (vmMemoryOverheadPercent).
MEMORY_OVERHEAD = Decimal("0.075")
# What the GPU nodes' DaemonSets request by default, as their charts and the EKS add-ons set it (the platform stack
# sets none): aws-node 25m CPU (amazon-vpc-cni-k8s charts/aws-vpc-cni/values.yaml) and its network policy agent as
# much (unverified), kube-proxy 100m, the EFA device plugin 10m and 20Mi (aws/eks-charts aws-efa-k8s-device-plugin);
# the Pod Identity agent, FSx CSI node plugin, NVIDIA device plugin, dcgm-exporter and node-exporter nothing.
DAEMONSET_REQUESTS = [{"cpu": "25m"}, {"cpu": "25m"}, {"cpu": "100m"}, {"cpu": "10m", "memory": "20Mi"}]


def kube_reserved_cpu_millicores(total: int) -> int:
    """nodeadm getCPUMillicoresToReserve and getResourceToReserveInRange, as written there."""
    ranges = [0, 1000, 2000, 4000, total]
    percentages = [600, 100, 50, 25]
    reserve = 0
    for i, percentage in enumerate(percentages):
        start, end = ranges[i], ranges[i + 1]
        if total > start:
            reserve += (min(total, end) - start) * percentage // 10000
    return reserve


def node_allocatable(instance_type: str) -> dict[str, Decimal]:
    """status.allocatable: capacity less kube-reserved and the eviction threshold, and memory less every hugepage
    size's capacity (pkg/kubelet/nodestatus/setters.go MachineInfo); devices as their plugins advertise them."""
    instance = hardware.INSTANCE_TYPES[instance_type]
    cpu_m = instance.vcpus * 1000
    memory = Decimal(instance.memory_gib * 2**30) * (1 - MEMORY_OVERHEAD)
    reserved = (11 * MAX_PODS[instance_type] + 255) * MIB + 100 * MIB
    return {
        "cpu": Decimal(cpu_m - kube_reserved_cpu_millicores(cpu_m)) / 1000,
        "memory": memory - reserved - NODE_HUGEPAGES,
        "hugepages-2Mi": Decimal(NODE_HUGEPAGES),
        "nvidia.com/gpu": Decimal(instance.gpus),
        "vpc.amazonaws.com/efa": Decimal(instance.efa_interfaces),
    }


def misfits(pods: list[dict], allocatable: dict[str, Decimal]) -> dict[str, tuple[Decimal, Decimal]]:
    """pkg/scheduler/framework/plugins/noderesources/fit.go fitsRequest: per resource, the pods' summed requests
    against the node's allocatable; what does not fit, as (requested, allocatable)."""
    asked: dict[str, Decimal] = {}
    for requests in pods:
        for name, quantity in requests.items():
            asked[name] = asked.get(name, Decimal(0)) + parse_quantity(quantity)
    return {
        name: (total, allocatable.get(name, Decimal(0)))
        for name, total in asked.items()
        if total > allocatable.get(name, Decimal(0))
    }
