"""The idle guard's decision, pure: from the jobs seen, the GPUs' utilisation over the window and the node group,
scale the GPU node group to zero or keep it, and why (trainkit/backends/eks/idle_guard.py gathers the inputs and
acts)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from observability.contract import NODE_LABEL

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
    """A trainkit PyTorchJob; `ended_at` (epoch seconds) is None while it has not ended (pending, running,
    restarting)."""

    name: str
    ended_at: float | None


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
    name: str
    status: str
    min_size: int
    max_size: int
    desired_size: int


@dataclass(frozen=True)
class Decision:
    scale_down: bool
    reason: str


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def decide(now: float, window_s: float, jobs: list[JobSeen], utilisation: Utilisation, group: NodeGroup) -> Decision:
    """Scale down only when the node group has nodes, no job ran in the window and every GPU reported near zero
    for all of it; the first thing that says otherwise is the reason to keep."""

    def keep(reason: str) -> Decision:
        return Decision(False, reason)

    if group.desired_size == 0:
        return keep(f"node group {group.name} is already at zero nodes")
    if group.status != "ACTIVE":
        return keep(f"node group {group.name} is {group.status}, not ACTIVE: an update is under way")
    if group.min_size > 0:
        return keep(
            f"node group {group.name} has minSize {group.min_size}, so it cannot go to zero: set gpu_min_nodes = 0 "
            "in terraform/stacks/infra/terraform.tfvars and run `make up PROFILE=aws`"
        )
    for job in jobs:
        if job.ended_at is None:
            return keep(f"job {job.name} has not ended")
        if now - job.ended_at < window_s:
            return keep(
                f"job {job.name} ended {_minutes(now - job.ended_at)} ago, within the {_minutes(window_s)} window"
            )
    if utilisation.end - utilisation.start < window_s or utilisation.end < now - utilisation.step:
        return keep("the utilisation query does not cover the window up to now")
    if not utilisation.series:
        return keep(f"no {UTIL_METRIC} series in the window: missing data counts as activity")
    for series in utilisation.series:
        if len(series.points) < utilisation.steps:
            return keep(
                f"{series.describe()} reported for {len(series.points)} of {utilisation.steps} steps of the window: "
                "a partial series counts as activity"
            )
    if len(utilisation.series) < utilisation.expected_gpus:
        return keep(
            f"{len(utilisation.series)} of the GPU nodes' {utilisation.expected_gpus} GPUs report {UTIL_METRIC}: "
            "a GPU without data counts as active"
        )
    busiest = max(
        ((value, series) for series in utilisation.series for _, value in series.points), key=lambda pair: pair[0]
    )
    if busiest[0] >= IDLE_PERCENT:
        return keep(f"{busiest[1].describe()} reached {busiest[0]:g}% utilisation within the window")
    return Decision(
        True,
        f"no trainkit job for {_minutes(window_s)} and all {len(utilisation.series)} GPUs below {IDLE_PERCENT}% "
        f"for the whole window: scaling {group.name} from {group.desired_size} nodes to 0",
    )
