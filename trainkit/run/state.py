"""A run's state, one typed value on every target (issue 51): what `invoke status` says first, whichever service
holds the job, mapped from each service's own states (the tables below, each cited), so a caller compares a value,
never a service's word."""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from pathlib import Path

from training.spec import SUMMARY_FILE


class RunState(enum.Enum):
    PENDING = "pending"
    """Accepted, not yet training: queued, waiting for capacity, starting its instances or pods."""
    RUNNING = "running"
    """Training (restarting workers in place counts: the job still holds its machines)."""
    STOPPING = "stopping"
    """Asked to stop; saving at a step boundary when time allows."""
    FINISHED = "finished"
    STOPPED = "stopped"
    """Ended before its last step on request (`invoke stop`, a deadline): the same command resumes it."""
    FAILED = "failed"
    LOST = "not running"
    """Local only: no process runs it and nothing it left says why (killed with its launcher)."""

    @property
    def ended(self) -> bool:
        """Nothing of it runs any more (a target holds no machine for it)."""
        return self in (RunState.FINISHED, RunState.STOPPED, RunState.FAILED, RunState.LOST)


@dataclass(frozen=True)
class RunStatus:
    """What `Backend.status` returns: the state, and the target's own account of it as text (`invoke status`)."""

    state: RunState | None
    """None: no run to speak of (EKS asked for the newest job of a namespace that holds none)."""
    text: str

    def __str__(self) -> str:
        return self.text


SAGEMAKER = {
    "InProgress": RunState.RUNNING,
    "Completed": RunState.FINISHED,
    "Failed": RunState.FAILED,
    "Stopping": RunState.STOPPING,
    "Stopped": RunState.STOPPED,
    "Deleting": RunState.STOPPING,
}
"""DescribeTrainingJob's TrainingJobStatus (botocore's SageMaker model, the TrainingJobStatus enum; a unit test holds
this table to it)."""
SAGEMAKER_NOT_YET = ("Starting", "Pending", "LaunchingMLInstances", "PreparingTrainingStack", "Downloading")
"""SecondaryStatus values of an InProgress job that has not begun training (its instances are being acquired and
set up, or its image and data fetched: API reference, DescribeTrainingJob SecondaryStatus)."""


def sagemaker_state(status: str, secondary: str | None) -> RunState:
    state = SAGEMAKER[status]
    return RunState.PENDING if state is RunState.RUNNING and secondary in SAGEMAKER_NOT_YET else state


BATCH = {
    "SUBMITTED": RunState.PENDING,
    "PENDING": RunState.PENDING,
    "RUNNABLE": RunState.PENDING,
    "STARTING": RunState.PENDING,
    "RUNNING": RunState.RUNNING,
    "SUCCEEDED": RunState.FINISHED,
    "FAILED": RunState.FAILED,
}
"""DescribeJobs' JobStatus (botocore's Batch model, the JobStatus enum; a unit test holds this table to it). Batch
has no state of its own for a job stopped on request: TerminateJob fails it with the reason given."""


def batch_state(status: str, reason: str | None, stopped_reason: str) -> RunState:
    """A job TerminateJob ended with `stopped_reason` (the one `invoke stop` gives) was stopped, not failed."""
    state = BATCH[status]
    return RunState.STOPPED if state is RunState.FAILED and reason == stopped_reason else state


PYTORCHJOB = {
    "Created": RunState.PENDING,
    "Running": RunState.RUNNING,
    "Restarting": RunState.RUNNING,
    "Succeeded": RunState.FINISHED,
    "Suspended": RunState.STOPPED,
    "Failed": RunState.FAILED,
}
"""A PyTorchJob's newest condition that holds: training-operator v1.9.4's JobConditionType values
(pkg/apis/kubeflow.org/v1/common_types.go: JobCreated, JobRunning, JobRestarting, JobSucceeded, JobSuspended,
JobFailed); a job with none yet is pending."""


def pytorchjob_state(holding: list[str]) -> RunState:
    return PYTORCHJOB[holding[-1]] if holding else RunState.PENDING


EARLY = re.compile(r"stopped early at step (\d+), best at step (\d+)")
"""How a run that stopped early (issue 52: --early-stop-patience) says so: after `finished` on every target's first
status line, and on a cluster node's console (and an EKS pod's termination message) when its torchrun ends
(trainkit/run/node.py): the line a remote target's status finds it by."""


def run_summary(run_dir: Path) -> dict:
    """The run's summary.json (its last act, training/common/run.py), {} before it has one or where it is unread."""
    try:
        return json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return {}


def stopped_early(summary: dict) -> str | None:
    """'stopped early at step N, best at step M' of a run's summary.json, None when it ran to its last step."""
    early = summary.get("stopped_early")
    return f"stopped early at step {early['step']}, best at step {early['best_step']}" if early else None


def early_in(lines) -> str | None:
    """The last 'stopped early ...' a run's nodes said (EARLY), found in their lines, or None."""
    found = [match.group(0) for line in lines for match in [EARLY.search(line)] if match]
    return found[-1] if found else None


def finished_said(state: RunState | None, early: str | None) -> str:
    """The state's word, with how a finished run ended when it stopped early."""
    if state is None:
        return "?"
    return f"{state.value}: {early}" if early and state is RunState.FINISHED else state.value
