"""What a PyTorchJob and its pods say about how the run stands: the conditions that hold, restarts, why a failed
container ended, how a finished one ended, the deadline that failed a job (`invoke status` on EKS reads these)."""

from __future__ import annotations

from trainkit.backends.base import deadline_cause_line
from trainkit.backends.eks import render


def restarts(pod) -> int:
    return sum(status.restart_count for status in (pod.status.container_statuses or []))


def holding(job: dict) -> list[str]:
    """The types of the job's conditions that hold (status "True"), oldest first."""
    return [c["type"] for c in job.get("status", {}).get("conditions", []) if c.get("status") == "True"]


def failure_cause(pods: list) -> str | None:
    """Why the job's first failed container ended: its termination message (the pod entry point's one line, or under
    FallbackToLogsOnError the log's last line), from the container's state or, after an in-place restart, its
    last state."""
    ended = []
    for pod in pods:
        for container in pod.status.container_statuses or []:
            for state in (container.state, container.last_state):
                terminated = state.terminated if state else None
                if terminated and terminated.exit_code and (terminated.message or "").strip():
                    ended.append((str(terminated.finished_at or ""), terminated.message.strip().splitlines()[-1]))
    return min(ended)[1] if ended else None


def ended_messages(pods: list) -> list[str]:
    """The termination messages of containers that ended with 0 (a pod entry point says there how the run ended
    when it stopped early: trainkit/run/node.py)."""
    return [
        state.terminated.message
        for pod in pods
        for container in pod.status.container_statuses or []
        for state in (container.state,)
        if state and state.terminated and state.terminated.exit_code == 0 and state.terminated.message
    ]


DEADLINE_MESSAGE = "was active longer than specified deadline"
"""In the Failed condition of a job past runPolicy.activeDeadlineSeconds (--max-runtime; training-operator v1.9.4,
JobController.ReconcileJobs in pkg/controller.v1/common/job.go; the reason is PyTorchJobFailed, as for any failure)."""


def deadline_cause(job: dict) -> str | None:
    """The one line of a job the operator failed at its --max-runtime deadline, or None."""
    conditions = job.get("status", {}).get("conditions", [])
    failed = next((c for c in conditions if c["type"] == "Failed" and c.get("status") == "True"), None)
    if failed is None or DEADLINE_MESSAGE not in failed.get("message", ""):
        return None
    limit = job["spec"].get("runPolicy", {}).get("activeDeadlineSeconds")
    run = job["metadata"]["annotations"][render.LABEL_RUN]
    return deadline_cause_line(
        limit,
        "from the job's start, runPolicy.activeDeadlineSeconds",
        "the operator deleted its running pods, which checkpoint at the step boundary when time allows",
        run,
    )
