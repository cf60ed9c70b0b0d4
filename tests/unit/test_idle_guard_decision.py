"""The idle guard's decision (trainkit/backends/eks/idle_decision.py), pure: what keeps the GPU nodes and
what lets them go; and the one line a failed run prints. The guard against a real Prometheus and moto's EKS:
tests/integration/test_idle_guard.py."""

from __future__ import annotations

import json

import pytest

from trainkit.backends.eks.idle_decision import GpuSeries, JobSeen, NodeGroup, Utilisation, decide
from trainkit.backends.eks.idle_guard import GuardSettings, failure, job_seen
from trainkit.errors import SpecError

NOW, WINDOW, STEP = 10_000.0, 1800.0, 60.0
GROUP = NodeGroup("gpu", "ACTIVE", 0, 2, 2)


def utilisation(values=(0.0,), gpus: int = 2, points: int | None = None) -> Utilisation:
    steps = int(WINDOW / STEP) + 1
    series = tuple(
        GpuSeries(
            {"UUID": f"GPU-{gpu}", "gpu": str(gpu), "Hostname": "node-a"},
            tuple(
                (NOW - WINDOW + i * STEP, values[i % len(values)] if gpu == 0 else 0.0) for i in range(points or steps)
            ),
        )
        for gpu in range(gpus)
    )
    return Utilisation(series, NOW - WINDOW, NOW, STEP, expected_gpus=gpus)


def test_idle_nodes_without_jobs_go_to_zero():
    decision = decide(NOW, WINDOW, [JobSeen("old", NOW - WINDOW - 1)], utilisation(), GROUP)
    assert decision.scale_down and "from 2 nodes to 0" in decision.reason


@pytest.mark.parametrize(
    ("jobs", "use", "group", "reason"),
    [
        ([JobSeen("run-a", None)], utilisation(), GROUP, "job run-a has not ended"),
        ([JobSeen("run-b", NOW - 60)], utilisation(), GROUP, "job run-b ended 1.0 min ago, within the 30.0 min window"),
        ([], utilisation(values=(0.0, 4.0, 37.0)), GROUP, "GPU 0 on node-a reached 37% utilisation"),
        ([], utilisation(gpus=0), GROUP, "no DCGM_FI_DEV_GPU_UTIL series in the window"),
        ([], utilisation(points=10), GROUP, "reported for 10 of 31 steps"),
        ([], Utilisation(utilisation().series, NOW - WINDOW, NOW, STEP, 16), GROUP, "2 of the GPU nodes' 16 GPUs"),
        ([], utilisation(), NodeGroup("gpu", "ACTIVE", 0, 2, 0), "already at zero"),
        ([], utilisation(), NodeGroup("gpu", "UPDATING", 0, 2, 2), "is UPDATING, not ACTIVE"),
        ([], utilisation(), NodeGroup("gpu", "ACTIVE", 1, 2, 2), "set gpu_min_nodes = 0"),
    ],
    ids=["running", "ended-in-window", "busy", "missing", "partial", "gpus-without-data", "zero", "updating", "min"],
)
def test_what_keeps_the_nodes(jobs, use, group, reason):
    decision = decide(NOW, WINDOW, jobs, use, group)
    assert not decision.scale_down and reason in decision.reason


def test_a_query_that_does_not_reach_now_keeps_the_nodes():
    short = utilisation()
    stale = Utilisation(short.series, short.start - 600, short.end - 600, STEP, short.expected_gpus)
    assert not decide(NOW, WINDOW, [], stale, GROUP).scale_down


def test_a_job_ends_only_with_succeeded_or_failed():
    def job(*conditions):
        return {"metadata": {"name": "j"}, "status": {"conditions": list(conditions)}}

    assert job_seen(job({"type": "Running", "status": "True"})).ended_at is None
    assert job_seen({"metadata": {"name": "j"}}).ended_at is None
    done = {"type": "Succeeded", "status": "True", "lastTransitionTime": "2026-01-01T00:00:10Z"}
    assert job_seen(job({"type": "Running", "status": "False"}, done)).ended_at == 1767225610.0
    assert job_seen(job({"type": "Failed", "status": "False"})).ended_at is None


@pytest.mark.parametrize(("window", "step"), [(0, 60), (30 * 60, -1), (60, 120)])
def test_bad_settings_are_refused(window, step):
    with pytest.raises(SpecError, match="window|step"):
        GuardSettings("trainkit", "gpu", window, step)


def test_what_a_run_cannot_get_past_is_one_line_and_a_bug_is_not_hidden():
    from botocore.exceptions import ClientError, NoCredentialsError
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import MaxRetryError

    denied = ClientError(
        {"Error": {"Code": "AccessDeniedException", "Message": "not authorized to perform: eks:DescribeNodegroup"}},
        "DescribeNodegroup",
    )
    forbidden = ApiException(status=403, reason="Forbidden")
    refusal = (  # the API server's wording (k8s.io/apiserver, forbidden responses)
        'pytorchjobs.kubeflow.org is forbidden: User "system:serviceaccount:trainkit-system:trainkit-idle-guard" '
        'cannot list resource "pytorchjobs"'
    )
    forbidden.body = json.dumps({"kind": "Status", "code": 403, "reason": "Forbidden", "message": refusal})
    lines = [failure(denied), failure(NoCredentialsError()), failure(forbidden)]
    assert lines == [
        "EKS DescribeNodegroup failed: AccessDeniedException: not authorized to perform: eks:DescribeNodegroup (check "
        "--cluster, --nodegroup and --region, and the guard's Pod Identity role in terraform/modules/gpu-nodegroup)",
        "AWS: Unable to locate credentials (in the cluster the guard's credentials come from its Pod Identity "
        "association)",
        f"the Kubernetes API refused a request (HTTP 403): {refusal} (the guard's Roles are in "
        "terraform/stacks/platform)",
    ]
    refused = MaxRetryError(None, "/api/v1/nodes", ConnectionRefusedError(111, "Connection refused"))
    unreachable = failure(refused)
    assert unreachable.startswith("cannot reach the Kubernetes API (MaxRetryError: ") and "\n" not in unreachable
    assert "Max retries exceeded with url: /api/v1/nodes" in unreachable and "Connection refused" in unreachable
    assert failure(KeyError("scalingConfig")) is None  # a bug keeps its traceback
