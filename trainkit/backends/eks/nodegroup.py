"""The GPU node group through EKS: read it, set its desired size, and what a submit asks of it when the idle guard
is on (trainkit/backends/eks/idle_guard.py scales it down and up between submits)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainkit.backends.eks.idle_decision import NodeGroup, wake_size
from trainkit.errors import SpecError


def describe_group(eks, cluster_name: str, nodegroup: str) -> NodeGroup:
    """EKS DescribeNodegroup: its status, scalingConfig and instanceTypes."""
    found = eks.describe_nodegroup(clusterName=cluster_name, nodegroupName=nodegroup)["nodegroup"]
    scaling = found["scalingConfig"]
    return NodeGroup(
        nodegroup,
        found["status"],
        scaling["minSize"],
        scaling["maxSize"],
        scaling["desiredSize"],
        tuple(found.get("instanceTypes") or ()),
    )


def scale_to(eks, cluster_name: str, group: NodeGroup, desired: int) -> dict:
    """UpdateNodegroupConfig with the whole scalingConfig (min and max as they are), so only the desired size
    changes; EKS refuses a desired size outside [minSize, maxSize] (InvalidParameterException "desiredSize can't be
    greater than maxSize", "Minimum capacity N can't be greater than desired size M")."""
    return eks.update_nodegroup_config(
        clusterName=cluster_name,
        nodegroupName=group.name,
        scalingConfig={"minSize": group.min_size, "maxSize": group.max_size, "desiredSize": desired},
    )["update"]


@dataclass(frozen=True)
class Wake:
    """What a submit asks of the guarded node group: `desired` nodes, from `group` as it was (through `eks`)."""

    cluster_name: str
    group: NodeGroup
    desired: int
    eks: object = field(compare=False, repr=False)


def plan_wake(infra, instance_type: str, min_nodes: int, nodes: int, eks=None) -> Wake | None:
    """Before a submit's preflight: None when the idle guard is off (the launcher scales nothing); else the node
    group as it is and the desired size the job needs (`wake_size`). A job the group can never run (another
    instance type, more nodes than maxSize) is refused here, before anything is scaled. Changes nothing."""
    guard = infra.idle_guard
    if not guard:
        return None
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    eks = eks or boto3.client("eks", region_name=guard["region"])
    try:
        group = describe_group(eks, guard["cluster_name"], guard["nodegroup"])
    except (BotoCoreError, ClientError) as error:
        raise SpecError(
            f"the idle guard is on and EKS did not describe node group {guard['nodegroup']} of cluster "
            f"{guard['cluster_name']} ({error}): refresh your AWS credentials, or run `make up PROFILE=aws` if the "
            "cluster is not up"
        ) from None
    return Wake(guard["cluster_name"], group, wake_size(group, instance_type, min_nodes, nodes), eks)


def wake(plan: Wake) -> str | None:
    """After the preflight passed, before the job is created: a node group that asks for fewer nodes than the job
    needs (the guard scaled it to zero, or an earlier job needed fewer) is asked for them. Returns a note when it
    was, None when it had enough."""
    if plan.desired <= plan.group.desired_size:
        return None
    scale_to(plan.eks, plan.cluster_name, plan.group, plan.desired)
    return (
        f"asked node group {plan.group.name} for {plan.desired} node(s) (it had {plan.group.desired_size}); the job "
        "stays Pending until they join (10 to 15 minutes)"
    )
