"""Exposed communication over a few steps, measured with torch.profiler (`invoke bench train` asks for it).

TRAINKIT_PROFILE_STEPS=FIRST:LAST (1-based, inclusive) profiles those steps on every rank; rank 0's figures go
into summary.json (`profile`) and each profiled step's metrics record is flagged `profiled` (the profiler's
overhead stays out of the bench's timings). Per step:

- communication_s: how long collectives ran (the union of their intervals);
- exposed_communication_s: how much of that no compute ran beside it, the time the step waited on the network.

What counts as which: on GPUs, NCCL kernels against every other kernel; on CPU, gloo's collectives (`gloo:*`,
run on gloo's own threads) against the leaf `aten::` operators of the other threads. A run without the variable
does not import the profiler.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

ENV = "TRAINKIT_PROFILE_STEPS"
Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same points."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def overlap(a: list[Interval], b: list[Interval]) -> float:
    """Length of the intersection of two unions (each sorted and disjoint)."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def exposed(communication: Iterable[Interval], compute: Iterable[Interval]) -> tuple[float, float]:
    """(communication time, the part of it under no compute)."""
    comm = union(communication)
    busy = length(comm)
    return busy, busy - overlap(comm, union(compute))


def classify(events) -> tuple[list[Interval], list[Interval]]:
    """(communication, compute) intervals in seconds from torch.profiler's FunctionEvents."""
    from torch.autograd import DeviceType

    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    if kernels:
        comm = [e for e in kernels if "nccl" in e.name.lower()]
        work = [e for e in kernels if "nccl" not in e.name.lower()]
    else:
        comm = [e for e in events if e.name.startswith("gloo:")]
        threads = {e.thread for e in comm}
        work = [e for e in events if e.thread not in threads and e.name.startswith("aten::") and not e.cpu_children]

    def seconds(chosen) -> list[Interval]:
        return [(e.time_range.start / 1e6, e.time_range.end / 1e6) for e in chosen]

    return seconds(comm), seconds(work)


class StepProfile:
    """Profiles steps FIRST..LAST of TRAINKIT_PROFILE_STEPS, or nothing when it is not set."""

    def __init__(self, spec: str | None = None):
        spec = os.environ.get(ENV) if spec is None else spec
        self.steps: range | None = None
        self.profiler = None
        self.covered: set[int] = set()  # the steps that ran under the profiler
        self.report: dict | None = None
        if spec:
            first, _, last = spec.partition(":")
            try:
                self.steps = range(int(first), int(last or first) + 1)
            except ValueError:
                self.steps = None
            if self.steps is None or not 1 <= self.steps.start < self.steps.stop:
                raise ValueError(f"{ENV}={spec!r}: give FIRST:LAST, 1-based step numbers, FIRST <= LAST")

    def profiled(self, step: int) -> bool:
        """Whether step `step` ran under the profiler (a run resumed inside the window profiles nothing)."""
        return step in self.covered

    def before(self, step: int) -> None:
        """Call before training step `step` (1-based)."""
        if self.steps is not None and step == self.steps.start:
            import torch
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self.profiler = profile(activities=activities)
            self.profiler.__enter__()

    def after(self, step: int) -> None:
        """Call after training step `step`; after the last profiled one the figures are computed."""
        if self.profiler is None:
            return
        self.covered.add(step)
        if step != self.steps[-1]:
            return
        self.profiler.__exit__(None, None, None)
        communication, exposed_s = exposed(*classify(self.profiler.events()))
        count = len(self.steps)
        self.report = {
            "steps": [self.steps.start, self.steps[-1]],
            "communication_s": communication / count,
            "exposed_communication_s": exposed_s / count,
        }
        self.profiler = None
