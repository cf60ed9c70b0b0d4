"""The idle guard's decisions, pure: from the jobs seen, the GPUs' utilisation over the window and the node group,
scale the GPU node group to zero, up to what a waiting job needs, or keep it, and why; and what a submit asks of
the group (trainkit/backends/eks/idle_guard.py gathers the inputs and acts)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from observability.contract import NODE_LABEL
from trainkit.errors import SpecError

UTIL_METRIC = "DCGM_FI_DEV_GPU_UTIL"
GPU_KEY = ("UUID", "gpu", NODE_LABEL)
"""What identifies one GPU across its series: dcgm-exporter adds the pod's namespace/pod/container while a pod holds
the GPU (observability/contract.py POD_LABELS), so one GPU's series changes when a job starts or ends; the query
takes the max over those, per GPU."""
IDLE_PERCENT = 5
"""Below this a GPU counts as idle. An unused GPU reads 0 (DCGM_FI_DEV_GPU_UTIL is the percentage of time a kernel
ran); 5 leaves room for a health check or an `nvidia-smi` while any training step keeps a GPU far above it."""
DEFAULT_WINDOW_MINUTES = 30
"""Idle for this long before the node group goes to zero. Two GPU nodes bill about $197/h on demand (p5.48xlarge,
trainkit/hardware.py), so 30 idle minutes cost about $98; a scale-up back from zero takes 10 to 15 minutes (EC2
launch, EFA and GPU device plugins), so a shorter window would cost users more waiting between quick runs than it
saves, and a longer one pays an hour of idle nodes after every run. The infra stack's idle_guard_minutes sets it."""
DEFAULT_STEP_S = 60
"""Resolution of the utilisation query: each point is the max over the step before it, so no sample is skipped;
four times the 15 s scrape interval (terraform/stacks/platform/values/dcgm-exporter.yaml), so one missed scrape is
not a gap while a stopped exporter is."""


@dataclass(frozen=True)
class JobSeen:
    """What uses or waits for the GPU nodes: a PyTorchJob that requests GPUs (with its pods), or a pod outside one
    that does. `name` is how reasons call it ("PyTorchJob <namespace>/<name>", "pod <namespace>/<name>");
    `ended_at` (epoch seconds) is None while it has not ended (pending, running, restarting); `nodes` is how many
    GPU nodes it needs; `unschedulable_since` (epoch seconds) is when the first of its pods the scheduler could not
    place became unschedulable, None when none is."""

    name: str
    ended_at: float | None
    nodes: int = 1
    unschedulable_since: float | None = None

    def stuck(self, now: float, window_s: float) -> bool:
        """Unschedulable for longer than the window: the node group as it is cannot run it (another instance type,
        more nodes than maxSize, more GPUs than a node has), so it is no reason to keep or wake the nodes."""
        return (
            self.ended_at is None and self.unschedulable_since is not None and now - self.unschedulable_since > window_s
        )

    def waiting(self, now: float, window_s: float) -> bool:
        """Not ended and not stuck: a reason to keep the nodes, and to wake them."""
        return self.ended_at is None and not self.stuck(now, window_s)


@dataclass(frozen=True)
class GpuSeries:
    """One GPU's utilisation over the window: its identity labels and (time, percent) points."""

    labels: dict
    points: tuple[tuple[float, float], ...]

    def describe(self) -> str:
        return f"GPU {self.labels.get('gpu', '?')} on {self.labels.get(NODE_LABEL, '?')}"


@dataclass(frozen=True)
class Utilisation:
    """The range query's answer: the series, the points each should have (start to end by step), and how many GPUs
    the GPU nodes have (each should report)."""

    series: tuple[GpuSeries, ...]
    start: float
    end: float
    step: float
    expected_gpus: int

    @property
    def steps(self) -> int:
        return math.floor((self.end - self.start) / self.step + 1e-9) + 1


@dataclass(frozen=True)
class NodeGroup:
    """The node group as EKS DescribeNodegroup gives it: status, scalingConfig and instanceTypes."""

    name: str
    status: str
    min_size: int
    max_size: int
    desired_size: int
    instance_types: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    """Keep the node group as it is (`desired` None), or set its desired size: 0 when nothing used it for the
    window, more when a job waits for nodes. `missing_data`: the keep is only for want of utilisation data."""

    reason: str
    desired: int | None = None
    missing_data: bool = False

    @property
    def scale_down(self) -> bool:
        return self.desired == 0

    @property
    def scale_up(self) -> bool:
        return bool(self.desired)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def decide(now: float, window_s: float, jobs: list[JobSeen], utilisation: Utilisation, group: NodeGroup) -> Decision:
    """Scale up when a job waits for more nodes than the group asks for (at most its maxSize); scale down only when
    the node group has nodes, no job ran in the window and every GPU reported near zero for all of it; the first
    thing that says otherwise is the reason to keep. A job stuck unschedulable for longer than the window counts
    for neither, and the reason names it."""
    stuck = [job for job in jobs if job.stuck(now, window_s)]
    counted = [job for job in jobs if not job.stuck(now, window_s)]
    ignored = "".join(
        f"; {job.name} not counted: unschedulable for {_minutes(now - job.unschedulable_since)}, longer than the "
        f"{_minutes(window_s)} window"
        for job in stuck
    )

    def keep(reason: str, missing_data: bool = False) -> Decision:
        return Decision(reason + ignored, None, missing_data)

    if group.status != "ACTIVE":
        return keep(f"node group {group.name} is {group.status}, not ACTIVE: an update is under way")
    waiting = [job for job in jobs if job.waiting(now, window_s)]
    if waiting:
        widest = max(waiting, key=lambda job: job.nodes)
        # EKS refuses a desired size above maxSize (UpdateNodegroupConfig answers InvalidParameterException
        # "desiredSize can't be greater than maxSize", as reported in ministryofjustice/cloud-platform-infrastructure
        # PR 4595; botocore's model does not say it): ask for at most that; the job's other pods stay unschedulable.
        need = min(widest.nodes, group.max_size)
        if need > group.desired_size:
            capped = f" (its maxSize; {widest.name} asks for {widest.nodes})" if need < widest.nodes else ""
            return Decision(
                f"{widest.name} has not ended and needs {widest.nodes} node(s): scaling {group.name} from "
                f"{group.desired_size} nodes to {need}{capped}" + ignored,
                need,
            )
    if group.desired_size == 0:
        return keep(f"node group {group.name} is already at zero nodes")
    if group.min_size > 0:
        return keep(
            f"node group {group.name} has minSize {group.min_size}, so it cannot go to zero: set gpu_min_nodes = 0 "
            "in terraform/stacks/infra/terraform.tfvars and run `make up PROFILE=aws`"
        )
    for job in counted:
        if job.ended_at is None:
            return keep(f"{job.name} has not ended")
        if now - job.ended_at < window_s:
            return keep(f"{job.name} ended {_minutes(now - job.ended_at)} ago, within the {_minutes(window_s)} window")
    if utilisation.end - utilisation.start < window_s or utilisation.end < now - utilisation.step:
        return keep("the utilisation query does not cover the window up to now")
    if not utilisation.series:
        return keep(f"no {UTIL_METRIC} series in the window: missing data counts as activity", missing_data=True)
    for series in utilisation.series:
        if len(series.points) < utilisation.steps:
            return keep(
                f"{series.describe()} reported for {len(series.points)} of {utilisation.steps} steps of the window: "
                "a partial series counts as activity",
                missing_data=True,
            )
    if len(utilisation.series) < utilisation.expected_gpus:
        return keep(
            f"{len(utilisation.series)} of the GPU nodes' {utilisation.expected_gpus} GPUs report {UTIL_METRIC}: "
            "a GPU without data counts as active",
            missing_data=True,
        )
    busiest = max(
        ((value, series) for series in utilisation.series for _, value in series.points), key=lambda pair: pair[0]
    )
    if busiest[0] >= IDLE_PERCENT:
        return keep(f"{busiest[1].describe()} reached {busiest[0]:g}% utilisation within the window")
    return Decision(
        f"no job for {_minutes(window_s)} and all {len(utilisation.series)} GPUs below {IDLE_PERCENT}% "
        f"for the whole window: scaling {group.name} from {group.desired_size} nodes to 0" + ignored,
        0,
    )


def wake_size(group: NodeGroup, instance_type: str, min_nodes: int, nodes: int) -> int:
    """The desired size a submit of `nodes` (at least `min_nodes`) nodes of `instance_type` asks of the node group:
    what it asks for already, or `nodes` when that is fewer. A job the group can never run is refused here, before
    anything is scaled: nodes woken for it would wait for a job that never starts."""
    types = ", ".join(group.instance_types)
    if group.instance_types and instance_type not in group.instance_types:
        raise SpecError(
            f"the job asks for {instance_type} nodes and GPU node group {group.name} has {types}: leave "
            f'--instance-type out (or give {group.instance_types[0]}), or set gpu_instance_type = "{instance_type}" '
            "in terraform/stacks/infra/terraform.tfvars and run `make up PROFILE=aws`; nothing was scaled"
        )
    if nodes > group.max_size:
        fewer = f"{min(min_nodes, group.max_size)}:{group.max_size}" if min_nodes < nodes else str(group.max_size)
        raise SpecError(
            f"the job asks for {nodes} nodes and GPU node group {group.name} grows to at most {group.max_size} (its "
            f"maxSize): ask for fewer with --nodes {fewer}, or raise gpu_max_nodes in "
            "terraform/stacks/infra/terraform.tfvars and run `make up PROFILE=aws`; nothing was scaled"
        )
    return max(group.desired_size, nodes)
