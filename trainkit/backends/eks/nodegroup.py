"""The GPU node group through EKS: read it, set its desired size, and what a submit asks of it. `make up` creates
the group with no nodes (gpu_desired_nodes = 0: it waits for no p5 capacity), so each submit asks it for the job's
nodes; the idle guard (trainkit/backends/eks/idle_guard.py, on by default) scales it down again once nothing uses
them, and up for a job the launcher did not wake it for."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from trainkit.backends.eks.idle_decision import DEFAULT_WINDOW_MINUTES, NodeGroup, demand, wake_size
from trainkit.backends.eks.idle_inputs import list_activity
from trainkit.backends.eks.kube import Kube, api_errors
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
    greater than maxSize", "Minimum capacity N can't be greater than desired size M"), and any update while the
    group is not ACTIVE (ResourceInUseException)."""
    return eks.update_nodegroup_config(
        clusterName=cluster_name,
        nodegroupName=group.name,
        scalingConfig={"minSize": group.min_size, "maxSize": group.max_size, "desiredSize": desired},
    )["update"]


@dataclass(frozen=True)
class Wake:
    """What a submit asks of the GPU node group: `desired` nodes, from `group` as it was (through `eks`);
    `guarded`: an idle guard runs on the group and gives the nodes back once nothing uses them."""

    cluster_name: str
    group: NodeGroup
    desired: int
    guarded: bool
    eks: object = field(compare=False, repr=False)

    @property
    def scales(self) -> bool:
        """It asks for more nodes than the group has, and EKS takes a new size now (the group is ACTIVE)."""
        return self.desired > self.group.desired_size and self.group.status == "ACTIVE"


def guard_runs(infra) -> bool:
    """The infra stack made the idle guard (idle_guard output) and `make up` pushed its image, so the platform
    stack runs its CronJob (terraform/stacks/platform: no image, no CronJob)."""
    return bool(infra.idle_guard and infra.idle_guard_image)


def plan_wake(
    infra, instance_type: str, min_nodes: int, nodes: int, kube: Kube, eks=None, clock=time.time
) -> Wake | None:
    """Before a submit's preflight: None when no `make up` recorded the GPU node group (a laptop's dry run: the
    launcher scales nothing); else the node group as it is and the desired size the job needs (`wake_size`) besides
    what GPU pods hold and what else waits (read from `kube` as the guard reads it). A job the group can never run
    (another instance type, more nodes than maxSize) is refused here, before anything is scaled. Changes nothing."""
    names = infra.gpu_nodegroup
    if not names:
        return None
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    eks = eks or boto3.client("eks", region_name=names["region"])
    try:
        group = describe_group(eks, names["cluster_name"], names["nodegroup"])
    except (BotoCoreError, ClientError) as error:
        raise SpecError(
            f"EKS did not describe the GPU node group {names['nodegroup']} of cluster {names['cluster_name']} "
            f"({error}), so the job cannot ask it for nodes: refresh your AWS credentials, or run "
            "`make up PROFILE=aws` if the cluster is not up"
        ) from None
    wake_size(group, instance_type, min_nodes, nodes)  # refuses before the cluster is read
    window = float((infra.idle_guard or {}).get("window_minutes") or DEFAULT_WINDOW_MINUTES) * 60
    api_error, _ = api_errors()
    try:
        others = demand(clock(), window, list_activity(kube, group), group)
    except api_error as error:
        if error.status != 403:
            raise
        # Credentials that may not list pods and PyTorchJobs in every namespace: the job's own need, and the guard's
        # next run adds what else runs or waits.
        print(
            "note: these credentials may not list GPU pods and PyTorchJobs in every namespace (HTTP 403), so the "
            "node group is asked for this job's nodes alone; the idle guard adds what else needs nodes at its next run",
            file=sys.stderr,
            flush=True,
        )
        others = None
    desired = wake_size(group, instance_type, min_nodes, nodes, others)
    return Wake(names["cluster_name"], group, desired, guard_runs(infra), eks)


def _describe_command(plan: Wake, query: str) -> str:
    return (
        f"`aws eks describe-nodegroup --cluster-name {plan.cluster_name} --nodegroup-name {plan.group.name} "
        f"--query nodegroup.{query}`"
    )


def _scale_command(plan: Wake, desired: int) -> str:
    return (
        f"`aws eks update-nodegroup-config --cluster-name {plan.cluster_name} --nodegroup-name {plan.group.name} "
        f"--scaling-config desiredSize={desired}`"
    )


def _unguarded(plan: Wake) -> str:
    """What a user without the idle guard must know about nodes the launcher asked for: they stay and bill."""
    return (
        "no idle guard runs on this group (idle_guard_minutes is null, or `make up` pushed no guard image), so they "
        f"stay up and bill after the job ends until you run {_scale_command(plan, 0)}"
    )


def wake(plan: Wake) -> str | None:
    """After the preflight passed, before the job is created: a node group that asks for fewer nodes than the job
    and what else runs or waits need (it was created empty, the guard scaled it to zero, or an earlier job needed
    fewer) is asked for them. Returns a note when it was (or could not be, while an update is under way), None when
    it had enough."""
    group = plan.group
    if plan.desired <= group.desired_size:
        return None
    # Not ACTIVE, EKS refuses any update (ResourceInUseException "Nodegroup cannot be updated as it is currently not
    # in Active State", as aws/karpenter-provider-aws issue 133 shows it): the guard's next run asks instead.
    if not plan.scales:
        then = (
            "the idle guard asks for them at its first run once it is ACTIVE (every 5 minutes)"
            if plan.guarded
            else f"once it is ACTIVE, run {_scale_command(plan, plan.desired)}"
        )
        return (
            f"node group {group.name} is {group.status}, not ACTIVE, so it was not asked for the {plan.desired} "
            f"node(s) the job needs (EKS takes no new size until then); {then}. If it stays {group.status}, "
            f"{_describe_command(plan, 'health')} says why"
        )
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        scale_to(plan.eks, plan.cluster_name, group, plan.desired)
    except (BotoCoreError, ClientError) as error:
        raise SpecError(
            f"EKS did not scale node group {group.name} to {plan.desired} node(s) ({error}); nothing was created: "
            f"submit again once {_describe_command(plan, 'status')} says ACTIVE"
        ) from None
    asked = (
        f"asked node group {group.name} for {plan.desired} node(s) (it had {group.desired_size}); the job stays "
        "Pending until they join (10 to 15 minutes)"
    )
    return asked if plan.guarded else f"{asked}; {_unguarded(plan)}"


UNWAKE_WAIT = {"Delay": 10, "MaxAttempts": 18}
"""How long a failed submit waits for the scale-up it asked for to end before it asks for the old size (EKS takes
one update at a time): 3 minutes, then the idle guard's window is the fallback."""


def unwake(plan: Wake) -> str:
    """Ask the node group for the size it had before `wake`, once EKS has taken the scale-up (waiter
    NodegroupActive); returns what was done, or what to run when EKS would not."""
    from botocore.exceptions import BotoCoreError, ClientError  # a WaiterError is a BotoCoreError

    before, group = plan.group.desired_size, plan.group
    try:
        waiter = plan.eks.get_waiter("nodegroup_active")
        waiter.wait(clusterName=plan.cluster_name, nodegroupName=group.name, WaiterConfig=UNWAKE_WAIT)
        scale_to(plan.eks, plan.cluster_name, group, before)
    except (BotoCoreError, ClientError) as error:
        return (
            f"the job was not created, and node group {group.name} could not be scaled back to {before} node(s) "
            f"({error}): run {_scale_command(plan, before)}"
            + (", or the idle guard scales it to zero after its window" if plan.guarded else "")
        )
    return f"the job was not created, so node group {group.name} was asked for its {before} node(s) again"


@contextmanager
def woken(plan: Wake | None) -> Iterator[str | None]:
    """Wake the node group for the job (yields wake's note), and if what follows fails (rendering or creating the
    job), scale the group back to the size it had and say so on stderr: no node stays up for a job that does not
    exist."""
    note = wake(plan) if plan else None
    try:
        yield note
    except Exception:
        if plan and plan.scales:
            print(f"note: {unwake(plan)}", file=sys.stderr, flush=True)
        raise
