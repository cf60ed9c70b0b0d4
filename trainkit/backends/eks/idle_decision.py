"""The idle guard's decisions, pure: from the jobs seen, the GPUs' utilisation over the window and the node group,
scale the GPU node group to zero, up to what runs and waits needs, or keep it, and why; and what a submit asks of
the group (trainkit/backends/eks/idle_guard.py gathers the inputs and acts)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from observability.contract import NODE_LABEL
from trainkit import hardware
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
class PodSeen:
    """A pod that has not ended and asks for the group's GPUs: the `gpus` it asks for (as many as a node has when
    it asks for all of a node's GPUs or EFA devices: it has the node to itself), the `node` it is bound to
    (spec.nodeName; None while the scheduler has not placed it), and since when (epoch seconds) it has been
    `blocked`, None when it is not: unschedulable, or on its node waiting for what the kubelet cannot get."""

    gpus: int
    node: str | None = None
    blocked_since: float | None = None
    blocked: str = "unschedulable"

    def stuck(self, now: float, window_s: float) -> bool:
        return self.blocked_since is not None and now - self.blocked_since > window_s


@dataclass(frozen=True)
class JobSeen:
    """What uses or waits for the GPU nodes: a PyTorchJob that requests GPUs, or a pod outside one that does.
    `name` is how reasons call it ("PyTorchJob <namespace>/<name>", "pod <namespace>/<name>"); `ended_at` (epoch
    seconds) is None while it has not ended (pending, running, restarting); `pods` are its pods that have not ended;
    `unplaced` the GPUs each of its replicas without a pod asks for (all of them before the operator creates the
    pods); `podless_since` since when a job has had no pods (its creation or its last condition change); `minimum`
    the nodes it needs at least to run (an elastic job's minReplicas)."""

    name: str
    ended_at: float | None
    pods: tuple[PodSeen, ...] = ()
    unplaced: tuple[int, ...] = ()
    podless_since: float | None = None
    minimum: int = 1

    def blocked(self) -> tuple[str, float] | None:
        """What holds it back and since when: every pod blocked (since the latest of them), or no pod at all."""
        if self.pods:
            if any(pod.blocked_since is None for pod in self.pods):
                return None
            latest = max(self.pods, key=lambda pod: pod.blocked_since)
            return latest.blocked, latest.blocked_since
        return ("without pods", self.podless_since) if self.podless_since is not None else None

    def stuck(self, now: float, window_s: float) -> bool:
        """Held back for longer than the window: unschedulable (another instance type, more nodes than maxSize,
        more GPUs than a node has), its images or config missing, or no pods: the node group as it is cannot run
        it, so it is no reason to keep or wake the nodes. A job with any pod that runs, or may, is not stuck."""
        blocked = self.blocked()
        return self.ended_at is None and blocked is not None and now - blocked[1] > window_s

    def counts(self, now: float, window_s: float) -> bool:
        """Not ended and not stuck: a reason to keep the nodes, and to wake them."""
        return self.ended_at is None and not self.stuck(now, window_s)

    def waiting_gpus(self, now: float, window_s: float) -> list[int]:
        """The GPUs of what no node holds yet and may still run: its unplaced replicas and unbound pods; a pod
        unschedulable for longer than the window adds nothing while others of its job run."""
        unbound = [pod.gpus for pod in self.pods if pod.node is None and not pod.stuck(now, window_s)]
        return [*unbound, *self.unplaced]


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

    @property
    def instance(self) -> hardware.InstanceType | None:
        """Its instance type in trainkit/hardware.py's table, None when the table does not have it."""
        return hardware.INSTANCE_TYPES.get(self.instance_types[0]) if self.instance_types else None

    @property
    def gpus_per_node(self) -> int:
        """GPUs one of its nodes has; 1 for a type the table lacks, so that each GPU pod counts a node."""
        return self.instance.gpus if self.instance else 1


def nodes_for(gpus: list[int], per_node: int) -> int:
    """Nodes for pods that ask for `gpus` each: one that asks for a node's worth has a node to itself, the others
    share nodes as their GPUs fill them (at least that many: CPUs or memory may not fit as GPUs do)."""
    whole = sum(1 for count in gpus if count >= per_node)
    return whole + math.ceil(sum(count for count in gpus if count < per_node) / per_node)


@dataclass(frozen=True)
class Demand:
    """The nodes GPU pods are bound to (`held`), the nodes what waits needs besides (`waiting`) and what waits;
    `notes` names what waits and is not woken for."""

    held: frozenset[str]
    waiting: int
    waiters: tuple[str, ...] = ()
    notes: str = ""

    @property
    def nodes(self) -> int:
        return len(self.held) + self.waiting


def demand(now: float, window_s: float, jobs: list[JobSeen], group: NodeGroup) -> Demand:
    """What the group's nodes are asked for: every bound pod holds its node (a stuck one too, until it is gone),
    and what counts and waits needs nodes for its GPUs, unless its minimum is more than maxSize: it could never
    run, so no node is woken for it (it still counts until it has been unschedulable for the window)."""
    held = frozenset(pod.node for job in jobs for pod in job.pods if pod.node)
    gpus, waiters, notes = [], [], []
    for job in jobs:
        wanted = job.waiting_gpus(now, window_s) if job.counts(now, window_s) else []
        if wanted and job.minimum > group.max_size:
            notes.append(
                f"; {job.name} not woken for: it needs at least {job.minimum} node(s) and {group.name} grows to at "
                f"most {group.max_size} (its maxSize)"
            )
        elif wanted:
            gpus += wanted
            waiters.append(job.name)
    return Demand(held, nodes_for(gpus, group.gpus_per_node), tuple(waiters), "".join(notes))


@dataclass(frozen=True)
class Decision:
    """Keep the node group as it is (`desired` None), or set its desired size: 0 when nothing used it for the
    window, more when a job waits for nodes. `missing_data`: the keep is only for want of utilisation data;
    `alarm` (set by the guard's run, not here): that keep has lasted too long, and what to check."""

    reason: str
    desired: int | None = None
    missing_data: bool = False
    alarm: str | None = None

    @property
    def scale_down(self) -> bool:
        return self.desired == 0

    @property
    def scale_up(self) -> bool:
        return bool(self.desired)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def decide(now: float, window_s: float, jobs: list[JobSeen], utilisation: Utilisation, group: NodeGroup) -> Decision:
    """Scale up when what runs and what waits need more nodes than the group asks for (at most its maxSize); scale
    down only when the node group has nodes, no job ran in the window and every GPU reported near zero for all of
    it; the first thing that says otherwise is the reason to keep. A job stuck for longer than the window counts
    for neither, and the reason names it."""
    stuck = [job for job in jobs if job.stuck(now, window_s)]
    counted = [job for job in jobs if not job.stuck(now, window_s)]
    need = demand(now, window_s, jobs, group)
    ignored = (
        "".join(
            f"; {job.name} not counted: {what} for {_minutes(now - since)}, longer than the {_minutes(window_s)} window"
            for job in stuck
            for what, since in [job.blocked()]
        )
        + need.notes
    )

    def keep(reason: str, missing_data: bool = False) -> Decision:
        return Decision(reason + ignored, None, missing_data)

    if group.status != "ACTIVE":
        return keep(f"node group {group.name} is {group.status}, not ACTIVE: an update is under way")
    # EKS refuses a desired size above maxSize (UpdateNodegroupConfig answers InvalidParameterException
    # "desiredSize can't be greater than maxSize", as reported in ministryofjustice/cloud-platform-infrastructure
    # PR 4595; botocore's model does not say it): ask for at most that; the other pods stay unschedulable.
    wanted = min(need.nodes, group.max_size)
    if need.waiting and wanted > group.desired_size:
        capped = f" (its maxSize; they need {need.nodes})" if wanted < need.nodes else ""
        waits = "waits" if len(need.waiters) == 1 else "wait"
        return Decision(
            f"{', '.join(need.waiters)} {waits} for {need.waiting} node(s) besides the {len(need.held)} that GPU pods "
            f"are on: scaling {group.name} from {group.desired_size} nodes to {wanted}{capped}" + ignored,
            wanted,
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
    if not utilisation.expected_gpus:
        # Nodes that never joined (bootstrap, AMI or EFA failures) report nothing and cost their price: no data.
        return keep(
            f"node group {group.name} asks for {group.desired_size} node(s) and no GPU node with GPUs has joined the "
            "cluster: nodes without data count as active",
            missing_data=True,
        )
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


def wake_size(group: NodeGroup, instance_type: str, min_nodes: int, nodes: int, others: Demand | None = None) -> int:
    """The desired size a submit of `nodes` (at least `min_nodes`) nodes of `instance_type` asks of the node group:
    the nodes GPU pods are on and what else waits (`others`) need, plus the job's nodes, at most maxSize; never
    less than the group asks for already. A job the group can never run is refused here, before anything is
    scaled: nodes woken for it would wait for a job that never starts."""
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
    return max(group.desired_size, min(group.max_size, (others.nodes if others else 0) + nodes))
