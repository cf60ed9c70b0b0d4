"""The idle guard's decisions (trainkit/backends/eks/idle_decision.py), pure: what keeps the GPU nodes, what lets
them go, what brings them back and what a submit may ask of the group; how the guard reads pods and PyTorchJobs;
and the one line a failed run prints. The guard against a real Prometheus and moto's EKS:
tests/integration/test_idle_guard.py."""

from __future__ import annotations

import json

import pytest

from trainkit.backends.eks.idle_decision import (
    GpuSeries,
    JobSeen,
    NodeGroup,
    PodSeen,
    Utilisation,
    decide,
    demand,
    wake_size,
)
from trainkit.backends.eks.idle_guard import GuardSettings, failure
from trainkit.backends.eks.idle_inputs import activity, ended_at, requests_gpus, timestamp
from trainkit.backends.eks.nodegroup import Wake, wake, woken
from trainkit.errors import SpecError

NOW, WINDOW, STEP = 10_000.0, 1800.0, 60.0
WHOLE = (NOW - WINDOW, NOW, STEP)
GROUP = NodeGroup("gpu", "ACTIVE", 0, 2, 2, ("p5.48xlarge",))


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
        ([JobSeen("job run-a", None)], utilisation(), GROUP, "job run-a has not ended"),
        ([JobSeen("job run-b", NOW - 60)], utilisation(), GROUP, "run-b ended 1.0 min ago, within the 30.0 min window"),
        ([], utilisation(values=(0.0, 4.0, 37.0)), GROUP, "GPU 0 on node-a reached 37% utilisation"),
        ([], Utilisation((), *WHOLE, 16), GROUP, "no DCGM_FI_DEV_GPU_UTIL series in the window"),
        ([], utilisation(gpus=0), GROUP, "gpu asks for 2 node(s) and no GPU node with GPUs has joined the cluster"),
        ([], utilisation(points=10), GROUP, "reported for 10 of 31 steps"),
        ([], Utilisation(utilisation().series, NOW - WINDOW, NOW, STEP, 16), GROUP, "2 of the GPU nodes' 16 GPUs"),
        ([], utilisation(), NodeGroup("gpu", "ACTIVE", 0, 2, 0), "already at zero"),
        ([], utilisation(), NodeGroup("gpu", "UPDATING", 0, 2, 2), "is UPDATING, not ACTIVE"),
        ([], utilisation(), NodeGroup("gpu", "ACTIVE", 1, 2, 2), "set gpu_min_nodes = 0"),
    ],
    ids=[
        "running",
        "ended-in-window",
        "busy",
        "missing",
        "no-node-joined",
        "partial",
        "gpus-without-data",
        "zero",
        "updating",
        "min",
    ],
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

    assert ended_at(job({"type": "Running", "status": "True"})) is None
    assert ended_at({"metadata": {"name": "j"}}) is None
    done = {"type": "Succeeded", "status": "True", "lastTransitionTime": "2026-01-01T00:00:10Z"}
    assert ended_at(job({"type": "Running", "status": "False"}, done)) == 1767225610.0
    assert ended_at(job({"type": "Failed", "status": "False"})) is None


# ---------------------------------------------------------------- scaling up, and what no longer counts


@pytest.mark.parametrize(
    ("desired", "nodes", "scaled_to", "said"),
    [
        (
            0,
            1,
            1,
            "PyTorchJob a/run waits for 1 node(s) besides the 0 that GPU pods are on: scaling gpu from 0 nodes to 1",
        ),
        (1, 2, 2, "waits for 2 node(s) besides the 0 that GPU pods are on: scaling gpu from 1 nodes to 2"),
        (0, 4, 2, "scaling gpu from 0 nodes to 2 (its maxSize; they need 4)"),
    ],
    ids=["at-zero", "fewer-than-needed", "capped-at-max"],
)
def test_a_waiting_job_scales_the_group_up_to_what_it_needs(desired, nodes, scaled_to, said):
    group = NodeGroup("gpu", "ACTIVE", 0, 2, desired)
    name = "PyTorchJob a/wide" if nodes > 2 else "PyTorchJob a/run"
    job = JobSeen(name, None, unplaced=(8,) * nodes, minimum=1)
    decision = decide(NOW, WINDOW, [job], utilisation(), group)
    assert decision.desired == scaled_to and decision.scale_up and not decision.scale_down
    assert said in decision.reason


def test_a_job_with_enough_nodes_keeps_them_and_a_changing_group_is_left_alone():
    running = [JobSeen("PyTorchJob a/run", None, (PodSeen(8, "node-a"), PodSeen(8, "node-b")))]
    assert decide(NOW, WINDOW, running, utilisation(), GROUP).desired is None
    updating = NodeGroup("gpu", "UPDATING", 0, 2, 0)
    assert decide(NOW, WINDOW, running, utilisation(), updating).desired is None


def test_a_job_unschedulable_longer_than_the_window_neither_keeps_nor_wakes_the_nodes():
    stuck = JobSeen("PyTorchJob a/wrong-type", None, (PodSeen(8, None, NOW - WINDOW - 60),) * 2)
    decision = decide(NOW, WINDOW, [stuck], utilisation(), GROUP)
    assert decision.scale_down
    assert decision.reason.endswith(
        "; PyTorchJob a/wrong-type not counted: unschedulable for 31.0 min, longer than the 30.0 min window"
    )
    at_zero = NodeGroup("gpu", "ACTIVE", 0, 2, 0)
    assert decide(NOW, WINDOW, [stuck], utilisation(), at_zero).desired is None
    recently = JobSeen("PyTorchJob a/waiting", None, (PodSeen(8, None, NOW - 60),) * 2)  # nodes on their way
    assert decide(NOW, WINDOW, [recently], utilisation(), at_zero).desired == 2


def test_only_missing_data_marks_a_keep_as_missing_data():
    missing = [utilisation(gpus=0), utilisation(points=10), Utilisation(utilisation().series, *WHOLE, 16)]
    assert all(decide(NOW, WINDOW, [], use, GROUP).missing_data for use in missing)
    assert not decide(NOW, WINDOW, [], utilisation(values=(50.0,)), GROUP).missing_data
    assert not decide(NOW, WINDOW, [JobSeen("job a", None)], utilisation(gpus=0), GROUP).missing_data


# ---------------------------------------------------------------- what a submit asks of the group


def test_a_submit_asks_for_what_the_group_lacks_and_never_more_than_it_has():
    assert wake_size(NodeGroup("gpu", "ACTIVE", 0, 2, 0), "p5.48xlarge", 1, 1) == 1
    assert wake_size(NodeGroup("gpu", "ACTIVE", 0, 4, 1), "p5.48xlarge", 3, 3) == 3
    assert wake_size(NodeGroup("gpu", "ACTIVE", 0, 4, 2), "p5.48xlarge", 1, 1) == 2


@pytest.mark.parametrize(
    ("instance_type", "nodes", "error"),
    [
        (
            "p4d.24xlarge",
            (1, 1),
            "the job asks for p4d.24xlarge nodes and GPU node group gpu has p5.48xlarge: leave --instance-type out "
            '(or give p5.48xlarge), or set gpu_instance_type = "p4d.24xlarge" in terraform/stacks/infra/'
            "terraform.tfvars and run `make up PROFILE=aws`; nothing was scaled",
        ),
        (
            "p5.48xlarge",
            (4, 4),
            "the job asks for 4 nodes and GPU node group gpu grows to at most 2 (its maxSize): ask for fewer with "
            "--nodes 2, or raise gpu_max_nodes in terraform/stacks/infra/terraform.tfvars and run `make up "
            "PROFILE=aws`; nothing was scaled",
        ),
        ("p5.48xlarge", (1, 4), "ask for fewer with --nodes 1:2, or raise gpu_max_nodes"),
    ],
    ids=["other-type", "wider-than-max", "elastic-wider-than-max"],
)
def test_a_job_the_group_can_never_run_is_refused_before_anything_scales(instance_type, nodes, error):
    with pytest.raises(SpecError) as refused:
        wake_size(NodeGroup("gpu", "ACTIVE", 0, 2, 0, ("p5.48xlarge",)), instance_type, *nodes)
    assert error in str(refused.value) and "\n" not in str(refused.value)


def _stubbed_eks():
    """An EKS client that makes no request: botocore's Stubber answers, and checks each call's parameters."""
    import boto3
    from botocore.stub import Stubber

    eks = boto3.client("eks", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
    return eks, Stubber(eks)


def _update(desired: int) -> tuple[dict, dict]:
    scaling = {"minSize": 0, "maxSize": 2, "desiredSize": desired}
    answer = {"update": {"id": f"u{desired}", "status": "InProgress", "type": "ConfigUpdate"}}
    return answer, {"clusterName": "trainkit", "nodegroupName": "gpu", "scalingConfig": scaling}


def test_a_job_not_created_after_the_wake_scales_the_group_back_and_says_so(capsys):
    eks, stub = _stubbed_eks()
    plan = Wake("trainkit", NodeGroup("gpu", "ACTIVE", 0, 2, 0, ("p5.48xlarge",)), 2, True, eks)
    stub.add_response("update_nodegroup_config", *_update(2))
    # the scale-back waits for EKS to take the scale-up (one update at a time), then asks for the old size
    stub.add_response(
        "describe_nodegroup", {"nodegroup": {"status": "ACTIVE"}}, {"clusterName": "trainkit", "nodegroupName": "gpu"}
    )
    stub.add_response("update_nodegroup_config", *_update(0))
    with stub, pytest.raises(RuntimeError, match="refused"), woken(plan) as note:
        assert note.startswith("asked node group gpu for 2 node(s) (it had 0)")
        raise RuntimeError("the API server refused the job")
    stub.assert_no_pending_responses()
    assert capsys.readouterr().err == (
        "note: the job was not created, so node group gpu was asked for its 0 node(s) again\n"
    )


def test_a_group_eks_will_not_scale_now_is_one_line_or_left_to_the_guard(capsys):
    eks, stub = _stubbed_eks()
    refusal = "Nodegroup cannot be updated as it is currently not in Active State"
    stub.add_client_error("update_nodegroup_config", "ResourceInUseException", refusal, 409)
    with stub, pytest.raises(SpecError) as refused:
        wake(Wake("trainkit", NodeGroup("gpu", "ACTIVE", 0, 2, 0), 2, True, eks))
    assert str(refused.value) == (
        "EKS did not scale node group gpu to 2 node(s) (An error occurred (ResourceInUseException) when calling the "
        f"UpdateNodegroupConfig operation: {refusal}); nothing was created: submit again once `aws eks "
        "describe-nodegroup --cluster-name trainkit --nodegroup-name gpu --query nodegroup.status` says ACTIVE"
    )
    updating = Wake("trainkit", NodeGroup("gpu", "UPDATING", 0, 2, 0), 2, True, eks)  # known before: no call at all
    with stub, pytest.raises(RuntimeError), woken(updating) as note:
        raise RuntimeError("creating the job failed")
    assert note.startswith(
        "node group gpu is UPDATING, not ACTIVE, so it was not asked for the 2 node(s) the job needs (EKS takes no "
        "new size until then); the idle guard asks for them at its first run once it is ACTIVE"
    )
    assert capsys.readouterr().err == ""
    unguarded = Wake("trainkit", NodeGroup("gpu", "UPDATING", 0, 2, 0), 2, False, eks)  # no guard asks later
    assert (
        "; once it is ACTIVE, run `aws eks update-nodegroup-config --cluster-name trainkit --nodegroup-name gpu "
        "--scaling-config desiredSize=2`. If it stays UPDATING" in wake(unguarded)
    )


# ---------------------------------------------------------------- what the guard reads as activity


def pod(name, namespace="team-a", phase="Running", gpus="1", job=None, unschedulable_at=None, node="node-a", **spec):
    """A GPU pod as the API serves it: bound to `node` unless the scheduler left it unschedulable."""
    container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    conditions = []
    if unschedulable_at is not None:
        node = None
        conditions = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": timestamp(unschedulable_at),
            }
        ]
    labels = {"training.kubeflow.org/job-name": job} if job else {}
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "creationTimestamp": timestamp(NOW)},
        "spec": {"containers": [container], **({"nodeName": node} if node else {}), **spec},
        "status": {"phase": phase, "conditions": conditions},
    }


def pytorchjob(
    name, namespace="trainkit-jobs", replicas=2, ended=None, instance_type="p5.48xlarge", gpus="8", efa=None, **spec
):
    resources = {"nvidia.com/gpu": gpus, **({"vpc.amazonaws.com/efa": efa} if efa else {})}
    template = {
        "spec": {
            "nodeSelector": {"node.kubernetes.io/instance-type": instance_type},
            "containers": [{"name": "pytorch", "resources": {"requests": resources}}],
        }
    }
    conditions = [{"type": "Succeeded", "status": "True", "lastTransitionTime": timestamp(ended)}] if ended else []
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": replicas, "template": template}}, **spec},
        "status": {"conditions": conditions},
    }


def test_gpus_are_asked_for_by_any_container_or_init_container_by_request_or_limit():
    def spec(part, gpus="1", key="containers"):
        return {key: [{"name": "c", "resources": {part: {"nvidia.com/gpu": gpus}}}]}

    assert requests_gpus(spec("requests")) and requests_gpus(spec("limits"))
    assert requests_gpus(spec("limits", key="initContainers"))
    assert not requests_gpus(spec("limits", gpus="0"))
    assert not requests_gpus({"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]})
    assert not requests_gpus({"containers": [{"name": "c"}]})


def test_what_uses_the_gpus_in_any_namespace_and_what_does_not():
    pods = [
        pod("notebook-0", namespace="research"),  # another team's GPU pod: activity
        pod("cpu-only", gpus="0"),
        pod("finished", phase="Succeeded"),
        pod("run-worker-0", namespace="trainkit-jobs", job="run", gpus="8"),  # folded into its job
        pod("run-worker-1", "trainkit-jobs", "Pending", "8", job="run", unschedulable_at=NOW - 600),
        pod("old-worker-0", namespace="trainkit-jobs", job="old"),  # its job ended: stands alone
        pod("elsewhere", nodeSelector={"node.kubernetes.io/instance-type": "g5.xlarge"}),  # never on this group
    ]
    jobs = [
        pytorchjob("run"),
        pytorchjob("old", ended=NOW - 7200),
        pytorchjob("queued", namespace="team-b", replicas=4),  # no pods yet: still activity
        pytorchjob("p4d", instance_type="p4d.24xlarge"),
    ]
    seen = {job.name: job for job in activity(jobs, pods, GROUP)}
    assert sorted(seen) == [
        "PyTorchJob team-b/queued",
        "PyTorchJob trainkit-jobs/old",
        "PyTorchJob trainkit-jobs/run",
        "pod research/notebook-0",
        "pod trainkit-jobs/old-worker-0",
    ]
    run = (PodSeen(8, "node-a"), PodSeen(8, None, NOW - 600))
    assert seen["PyTorchJob trainkit-jobs/run"] == JobSeen("PyTorchJob trainkit-jobs/run", None, run, minimum=2)
    assert seen["PyTorchJob team-b/queued"].unplaced == (8,) * 4 and seen["PyTorchJob team-b/queued"].minimum == 4
    assert seen["PyTorchJob trainkit-jobs/old"].ended_at == NOW - 7200
    assert seen["pod research/notebook-0"] == JobSeen("pod research/notebook-0", None, (PodSeen(1, "node-a"),))


def test_a_pod_held_by_scheduling_gates_is_not_unschedulable():
    gated = pod("gated", phase="Pending", node=None)
    gated["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]
    (seen,) = activity([], [gated], GROUP)
    assert seen.pods == (PodSeen(1),) and not seen.stuck(NOW + 7200, WINDOW)


def test_a_job_with_a_running_pod_stays_activity_while_another_of_its_pods_is_unschedulable():
    """15 of 16 workers run (restoring, or in a rendezvous wait, their GPUs near 0%) and one has been unschedulable
    for longer than the window: the job is not stuck, its running pods keep the 16 nodes, and the unschedulable
    one adds nothing to what the group is asked for."""
    group = NodeGroup("gpu", "ACTIVE", 0, 16, 16, ("p5.48xlarge",))
    pods = [pod(f"big-worker-{i}", "trainkit-jobs", gpus="8", job="big", node=f"node-{i}") for i in range(15)]
    pods.append(pod("big-worker-15", "trainkit-jobs", "Pending", "8", job="big", unschedulable_at=NOW - WINDOW - 60))
    (job,) = activity([pytorchjob("big", replicas=16)], pods, group)
    assert not job.stuck(NOW, WINDOW) and job.counts(NOW, WINDOW)
    decision = decide(NOW, WINDOW, [job], utilisation(), group)
    assert decision.desired is None and decision.reason == "PyTorchJob trainkit-jobs/big has not ended"
    assert demand(NOW, WINDOW, [job], group).nodes == 15
    alone = JobSeen("PyTorchJob a/alone", None, (PodSeen(8, None, NOW - WINDOW - 60),) * 2)  # none bound: stuck
    assert alone.stuck(NOW, WINDOW)


def _bound(name: str, nodes: int, gpus: int = 8) -> JobSeen:
    return JobSeen(name, None, tuple(PodSeen(gpus, f"{name}-node-{i}") for i in range(nodes)))


def test_what_runs_and_what_waits_add_up_to_what_the_group_is_asked_for():
    """Job A runs on 8 nodes of a group at 8 (max 16) and job B waits for 8 more: 16, for the guard and for a
    submit alike; never more than maxSize."""
    group = NodeGroup("gpu", "ACTIVE", 0, 16, 8, ("p5.48xlarge",))
    running, waiting = _bound("PyTorchJob a/a", 8), JobSeen("PyTorchJob a/b", None, unplaced=(8,) * 8, minimum=8)
    decision = decide(NOW, WINDOW, [running, waiting], utilisation(), group)
    assert decision.desired == 16
    assert (
        decision.reason
        == "PyTorchJob a/b waits for 8 node(s) besides the 8 that GPU pods are on: scaling gpu from 8 nodes to 16"
    )
    assert wake_size(group, "p5.48xlarge", 8, 8, demand(NOW, WINDOW, [running], group)) == 16
    smaller = NodeGroup("gpu", "ACTIVE", 0, 12, 8, ("p5.48xlarge",))
    assert decide(NOW, WINDOW, [running, waiting], utilisation(), smaller).reason.endswith(
        "scaling gpu from 8 nodes to 12 (its maxSize; they need 16)"
    )
    assert wake_size(smaller, "p5.48xlarge", 8, 8, demand(NOW, WINDOW, [running, waiting], smaller)) == 12


@pytest.mark.parametrize(
    ("job", "nodes"),
    [
        (pytorchjob("one-gpu-each", replicas=8, gpus="1"), 1),  # 8 x 1 GPU share one p5
        (pytorchjob("three-each", replicas=4, gpus="3"), 2),
        (pytorchjob("whole-nodes", replicas=3), 3),
        (pytorchjob("all-efa", replicas=2, gpus="4", efa="32"), 2),  # trainkit's workers: all of a node's EFA
    ],
    ids=["gpus-share-a-node", "partial", "whole-gpus", "whole-efa"],
)
def test_a_pytorchjob_is_sized_by_its_gpus_on_the_groups_instance_type(job, nodes):
    at_zero = NodeGroup("gpu", "ACTIVE", 0, 8, 0, ("p5.48xlarge",))
    assert decide(NOW, WINDOW, activity([job], [], at_zero), utilisation(), at_zero).desired == nodes


def test_a_daemonsets_gpu_pod_is_part_of_the_nodes_not_a_use_of_them():
    agent = pod("gpu-health-abcde", namespace="kube-system")
    agent["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpu-health", "uid": "u1", "controller": True}
    ]
    assert activity([], [agent], GROUP) == []
    assert decide(NOW, WINDOW, activity([], [agent], GROUP), utilisation(), GROUP).scale_down


def _waiting(reason: str, since: float) -> dict:
    stalled = pod("puller", namespace="research")
    stalled["status"]["containerStatuses"] = [
        {
            "name": "c",
            "ready": False,
            "restartCount": 0,
            "image": "x",
            "imageID": "",
            "state": {"waiting": {"reason": reason}},
        }
    ]
    stalled["status"]["conditions"] = [
        {"type": "ContainersReady", "status": "False", "lastTransitionTime": timestamp(since)}
    ]
    return stalled


@pytest.mark.parametrize(
    "reason", ["ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError", "InvalidImageName"]
)
def test_a_pod_waiting_for_what_the_kubelet_cannot_get_is_stuck_after_the_window(reason):
    (long,) = activity([], [_waiting(reason, NOW - WINDOW - 60)], GROUP)
    decision = decide(NOW, WINDOW, [long], utilisation(), GROUP)
    assert decision.scale_down and f"pod research/puller not counted: in {reason} for 31.0 min" in decision.reason
    (recent,) = activity([], [_waiting(reason, NOW - 60)], GROUP)
    assert recent.counts(NOW, WINDOW)
    (pulling,) = activity([], [_waiting("ContainerCreating", NOW - WINDOW - 60)], GROUP)
    assert pulling.counts(NOW, WINDOW)


def test_a_pytorchjob_without_pods_is_stuck_once_the_window_has_passed_since_it_was_created_or_changed():
    created = pytorchjob("podless")
    created["metadata"]["creationTimestamp"] = timestamp(NOW - WINDOW - 60)
    (job,) = activity([created], [], GROUP)
    assert job.stuck(NOW, WINDOW) and job.blocked() == ("without pods", NOW - WINDOW - 60)
    restarting = {"type": "Restarting", "status": "True", "lastTransitionTime": timestamp(NOW - 60)}
    created["status"]["conditions"] = [restarting]  # its pods are being replaced
    (job,) = activity([created], [], GROUP)
    assert job.counts(NOW, WINDOW)


def test_a_job_whose_minimum_is_wider_than_max_wakes_nothing_and_an_elastic_one_wakes_max():
    at_zero = NodeGroup("gpu", "ACTIVE", 0, 2, 0, ("p5.48xlarge",))
    wide = activity([pytorchjob("wide", replicas=4)], [], at_zero)
    decision = decide(NOW, WINDOW, wide, utilisation(), at_zero)
    assert decision.desired is None and decision.reason == (
        "node group gpu is already at zero nodes; PyTorchJob trainkit-jobs/wide not woken for: it needs at least 4 "
        "node(s) and gpu grows to at most 2 (its maxSize)"
    )
    elastic = pytorchjob("elastic", replicas=4, elasticPolicy={"minReplicas": 1, "maxReplicas": 4})
    assert decide(NOW, WINDOW, activity([elastic], [], at_zero), utilisation(), at_zero).desired == 2


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
