"""What a training worker asks of its node. A worker has its node to itself (it takes every EFA device), so it asks for
the node's GPUs and EFA devices, EFA's hugepages, and the CPU and memory the node has left for pods, each request equal
to its limit. That makes the pod Guaranteed (Kubernetes, "Configure Quality of Service for Pods": every container has
CPU and memory limits and requests, and they are equal), the last a node evicts under pressure and the last its OOM
killer picks; with no CPU or memory request the workers were BestEffort, the first of both.

What the node has left for pods is its allocatable, as the kubelet of the EKS AL2023 NVIDIA AMI computes it (capacity
less kube-reserved, the hard eviction threshold and, for memory, the pre-allocated hugepages), less a margin for the
DaemonSets that run on every GPU node. No node is read: the sizes come from the instance table (trainkit/tables/
instance_types.json: vCPUs and memory from EC2's accelerated computing instance specifications).
"""

from __future__ import annotations

from trainkit.hardware import InstanceType

HUGEPAGES_MIB = 5120
"""hugepages-2Mi a worker asks for. EKS User Guide, "Run machine learning training on Amazon EKS with Elastic Fabric
Adapter": instances with the EFA driver pre-allocate 5128 2 MiB hugepages, and its example worker on p5.48xlarge (8
GPUs, 32 EFA devices) asks for 5120Mi, requests equal to limits. A container that asks for none gets a hugetlb limit of
0 (kubelet pkg/kubelet/kuberuntime/kuberuntime_container_linux.go GetHugepageLimitsFromResources), so libfabric's EFA
provider cannot use them."""
NODE_HUGEPAGES_MIB = 5128 * 2
"""The node's pre-allocated hugepages (same guide), which the kubelet takes out of allocatable memory (kubernetes
pkg/kubelet/nodestatus/setters.go MachineInfo: every hugepage size's capacity)."""
VM_MEMORY_OVERHEAD = 0.075
"""The node's memory capacity is the kernel's MemTotal, below the instance's published memory. With no node to read,
this share is taken off, as Karpenter does for every instance type (its settings.vmMemoryOverheadPercent, 0.075)."""
EVICTION_HARD_MIB = 100
"""nodeadm's evictionHard memory.available (awslabs/amazon-eks-ami nodeadm/internal/kubelet/config.go)."""
ENI_MAX_PODS = {
    "p4d.24xlarge": 737,
    "p4de.24xlarge": 737,
    "p5.48xlarge": 100,
    "p5e.48xlarge": 100,
    "p5en.48xlarge": 198,
}
"""The kubelet's maxPods on the EKS AMI, which sizes kube-reserved memory: amazon-eks-ami nodeadm/internal/kubelet/
eni-max-pods.txt (ENIs x (IPv4 addresses per ENI - 1) + 2, network card 0 only)."""
DAEMONSETS_CPU_M = 2000
DAEMONSETS_MEMORY_MIB = 8 * 1024
"""Kept for what else runs on a GPU node: the DaemonSets aws-node (VPC CNI, with its network policy agent), kube-proxy,
the EKS Pod Identity agent and the FSx CSI node plugin (terraform/modules/eks add-ons), the NVIDIA and EFA device
plugins, dcgm-exporter and node-exporter (terraform/stacks/platform), and the node's own services, for which nodeadm
reserves nothing (no systemReserved). The platform stack sets no requests for any of them and their defaults are small
(aws-node 25m CPU, kube-proxy 100m, the EFA device plugin 10m and 20Mi, the others none), so this is a margin for
what they use, not a sum of requests."""


def kube_reserved_cpu_m(vcpus: int) -> int:
    """nodeadm's getCPUMillicoresToReserve: 6% of the first core, 1% of the second, 0.5% of the next two and 0.25%
    of the rest, each band rounded down."""
    total = vcpus * 1000
    bands = ((0, 1000, 600), (1000, 2000, 100), (2000, 4000, 50), (4000, total, 25))
    return sum((min(total, end) - start) * per_10000 // 10000 for start, end, per_10000 in bands if total > start)


def kube_reserved_memory_mib(max_pods: int) -> int:
    """nodeadm's getMemoryMebibytesToReserve."""
    return 11 * max_pods + 255


def node_allocatable(instance: InstanceType) -> tuple[int, int]:
    """(CPU in millicores, memory in MiB) the kubelet makes allocatable on a node of this type."""
    cpu_m = instance.vcpus * 1000 - kube_reserved_cpu_m(instance.vcpus)
    hugepages = NODE_HUGEPAGES_MIB if instance.efa_interfaces else 0
    capacity = int(instance.memory_gib * 1024 * (1 - VM_MEMORY_OVERHEAD))
    memory_mib = capacity - kube_reserved_memory_mib(ENI_MAX_PODS[instance.name]) - EVICTION_HARD_MIB - hugepages
    return cpu_m, memory_mib


def worker_resources(instance: InstanceType, gpus: int) -> dict:
    """The worker container's `resources`: whole CPUs and GiB of what is left, requests and limits alike (extended
    resources and hugepages must have them equal too)."""
    cpu_m, memory_mib = node_allocatable(instance)
    asked = {
        "cpu": str((cpu_m - DAEMONSETS_CPU_M) // 1000),
        "memory": f"{(memory_mib - DAEMONSETS_MEMORY_MIB) // 1024}Gi",
        "nvidia.com/gpu": str(gpus),
    }
    if instance.efa_interfaces:
        asked["vpc.amazonaws.com/efa"] = str(instance.efa_interfaces)
        asked["hugepages-2Mi"] = f"{HUGEPAGES_MIB}Mi"
    return {"requests": dict(asked), "limits": dict(asked)}
