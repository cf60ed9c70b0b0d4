"""The idle guard (trainkit/backends/eks/idle_guard.py) against a real Prometheus (Debian's 2.42) scraping a
dcgm-exporter stand-in, moto's EKS and the Kubernetes test API server (tests/helpers/idle_guard.py).

One Prometheus records a short history once, in phases: GPUs idle, one GPU busy (held by a job's pod, so its
series carries the pod labels), idle again, then no series at all (the exporter gone). Each test then runs the
guard with a fake clock set to the end of the phase it needs, with the real query over a 2 s window at 0.5 s steps
(the query and the decision are the production ones; only the window is short). What counts as activity is put
in the API server as the guard finds it in a cluster: PyTorchJobs, and pods (of a job, of another namespace, or
left unschedulable by the scheduler). The launcher's side too: a submit with the guard on checks, then wakes the
node group (trainkit/backends/eks/nodegroup.py), then creates the job.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import zlib

import pytest

from tests.helpers.aws import ThreadedMoto
from tests.helpers.containers import free_port
from tests.helpers.eks import IMAGE
from tests.helpers.idle_guard import DcgmStandIn, GuardCluster, checked_eks, gpu_nodegroup
from tests.helpers.kube_api import status_body
from tests.helpers.paths import REPO
from trainkit.backends import job_from_flags as build_spec
from trainkit.backends.eks import backend, cluster, idle_guard, idle_inputs, nodegroup
from trainkit.backends.eks.kube import Kube
from trainkit.errors import SpecError
from trainkit.infra import images, outputs
from trainkit.plan.prices import table
from trainkit.services.prometheus import GPU_JOB, PrometheusServer, write_targets
from trainkit.workloads.recipe import recipe

WINDOW_S, STEP_S = 2.0, 0.5
PHASE_S = WINDOW_S + STEP_S + 0.4  # the first step looks one step back from the window's start


def _has_samples(prometheus: PrometheusServer, count: int) -> bool:
    query = urllib.parse.urlencode({"query": f"count({idle_inputs.UTIL_METRIC})"})
    with urllib.request.urlopen(f"http://{prometheus.endpoint}/api/v1/query?{query}", timeout=5) as response:
        body = response.read().decode()
    return f'"{count}"' in body


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """{phase: the moment it ended}, and Prometheus's URL."""
    exporter = DcgmStandIn()
    prometheus = PrometheusServer(tmp_path_factory.mktemp("prometheus"), scrape_interval="100ms").start()
    try:
        write_targets(prometheus.root, GPU_JOB, "dcgm", [exporter.address])
        deadline = time.monotonic() + 15
        while not _has_samples(prometheus, 8):
            assert time.monotonic() < deadline, "Prometheus did not scrape the stand-in"
            time.sleep(0.1)
        ends = {}
        time.sleep(1.0)
        with exporter.lock:
            exporter.util[3] = 71.0
            exporter.held[3] = ("trainkit-jobs", "llama-worker-0", "pytorch")
        time.sleep(1.5)
        ends["busy"] = time.time()
        with exporter.lock:
            exporter.util[3] = 0.0
            exporter.held.clear()
        time.sleep(PHASE_S)
        ends["idle"] = time.time()
        with exporter.lock:
            exporter.serving = False
        time.sleep(PHASE_S)
        ends["missing"] = time.time()
        time.sleep(0.3)  # the last scrapes are in
        yield ends, f"http://{prometheus.endpoint}"
    finally:
        exporter.close()
        prometheus.stop()


@pytest.fixture(scope="module")
def moto():
    with ThreadedMoto() as server:
        yield server


@pytest.fixture
def api(tmp_path, monkeypatch):
    with GuardCluster(tmp_path / "cluster") as fake:
        fake.add_nodes("p5.48xlarge", 1, gpus=8, efa=32)
        monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig()))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield fake


def group_name(request, suffix: str = "") -> str:
    return request.node.name.replace("_", "-")[:56] + suffix


def guard(
    history, moto, api, request, at: str, offset: float = 0.0, group_min: int = 0, suffix: str = "", group_max: int = 2
):
    """Run the guard once at the end of phase `at` (+ offset) on a node group at 2 nodes; returns its decision, the
    node group after it, the EKS calls it made and the status it recorded."""
    ends, prometheus = history
    eks, calls = checked_eks(moto)
    name = group_name(request, suffix)
    gpu_nodegroup(eks, name, desired=2, minimum=group_min, maximum=group_max)
    calls.clear()
    settings = idle_guard.GuardSettings("trainkit", name, WINDOW_S, STEP_S, prometheus)
    decision = idle_guard.run_once(settings, Kube.connect(), eks, clock=lambda: ends[at] + offset)
    group = eks.describe_nodegroup(clusterName="trainkit", nodegroupName=name)["nodegroup"]["scalingConfig"]
    status = api.configmaps[(cluster.PLATFORM_NAMESPACE, cluster.IDLE_GUARD)]["data"]
    return decision, group, [op for op, _ in calls if not op.startswith("Describe")], status, calls


def test_scales_to_zero_after_the_idle_window(history, moto, api, request):
    decision, group, writes, status, calls = guard(history, moto, api, request, "idle")
    assert decision.scale_down, decision.reason
    assert group["desiredSize"] == 0 and group["minSize"] == 0 and group["maxSize"] == 2
    assert writes == ["UpdateNodegroupConfig"]
    (update,) = [params for op, params in calls if op == "UpdateNodegroupConfig"]
    assert update["scalingConfig"] == {"minSize": 0, "maxSize": 2, "desiredSize": 0}
    assert status["decision"] == "scaled-down" and status["desired_size"] == "0" and status["scaled_down_at"]
    (event,) = api.events
    assert event["reason"] == "ScaledToZero" and "8 GPUs below 5%" in event["message"]
    assert event["involvedObject"]["name"] == cluster.IDLE_GUARD


def test_keeps_the_nodes_while_a_job_runs(history, moto, api, request):
    api.add_job("llama-run", [{"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}])
    decision, group, writes, status, _ = guard(history, moto, api, request, "idle")
    assert not decision.scale_down and decision.reason == "PyTorchJob trainkit-jobs/llama-run has not ended"
    assert group["desiredSize"] == 2 and writes == [] and not api.events
    assert status["decision"] == "keep" and status["reason"] == decision.reason


def test_a_job_that_ended_within_the_window_is_activity_and_one_before_it_is_not(history, moto, api, request):
    ended = history[0]["idle"] - 0.5  # the fake clock's now is the idle phase's end
    api.add_job("ended-recently", [{"type": "Succeeded", "status": "True", "lastTransitionTime": _rfc3339(ended)}])
    decision, group, _, _, _ = guard(history, moto, api, request, "idle")
    assert not decision.scale_down and "ended-recently ended" in decision.reason and group["desiredSize"] == 2

    api.jobs.clear()
    api.add_job("ended-long-ago", [{"type": "Failed", "status": "True", "lastTransitionTime": _rfc3339(ended - 60)}])
    decision, group, _, status, _ = guard(history, moto, api, request, "idle", suffix="-2")
    assert decision.scale_down, decision.reason
    assert group["desiredSize"] == 0 and status["decision"] == "scaled-down"  # the status ConfigMap was replaced


def test_keeps_the_nodes_while_a_gpu_is_busy(history, moto, api, request):
    decision, group, writes, _, _ = guard(history, moto, api, request, "busy")
    # GPU 3's series changed labels when the pod took it; per GPU it is still one whole series.
    assert not decision.scale_down and decision.reason.startswith("GPU 3 on ip-10-0-0-1.ec2.internal reached 71%")
    assert group["desiredSize"] == 2 and writes == []


def test_never_scales_down_when_the_series_are_missing(history, moto, api, request):
    decision, group, writes, _, _ = guard(history, moto, api, request, "missing")
    assert not decision.scale_down and "no DCGM_FI_DEV_GPU_UTIL series" in decision.reason
    assert group["desiredSize"] == 2 and writes == []


def test_a_series_that_stops_within_the_window_counts_as_activity(history, moto, api, request):
    decision, group, writes, _, _ = guard(history, moto, api, request, "idle", offset=WINDOW_S / 2)
    assert not decision.scale_down and "a partial series counts as activity" in decision.reason
    assert group["desiredSize"] == 2 and writes == []


def test_fewer_gpus_reporting_than_the_nodes_have_counts_as_activity(history, moto, api, request):
    api.add_nodes("p5.48xlarge", 1, gpus=8, efa=32)  # a second node whose exporter serves nothing
    decision, group, writes, _, _ = guard(history, moto, api, request, "idle")
    assert not decision.scale_down and decision.reason.startswith("8 of the GPU nodes' 16 GPUs report")
    assert group["desiredSize"] == 2 and writes == []


def _rfc3339(epoch: float) -> str:
    return idle_inputs.timestamp(epoch)


GUARD_REPOSITORY = "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainkit/idle-guard"


def _infra(nodegroup: str):
    from trainkit.infra.outputs import InfraOutputs

    names = {"cluster_name": "trainkit", "region": "us-east-1", "nodegroup": nodegroup}
    return InfraOutputs(
        "p5.48xlarge",
        None,
        "us-east-1",
        recorded=True,
        idle_guard={**names, "window_minutes": 30},
        gpu_nodegroup=names,
        idle_guard_image=f"{GUARD_REPOSITORY}:guard-amd64-0123abc",
    )


def test_a_submit_scales_the_group_up_to_what_runs_plus_the_jobs_need(moto, api, request):
    """A 1-node job runs on the group's one node (maxSize 4): a 2-node job gets three, as the guard counts it;
    one that fits what the group asks for then changes nothing."""
    eks, calls = checked_eks(moto)
    name = request.node.name.replace("_", "-")[:56]
    gpu_nodegroup(eks, name, desired=1, maximum=4)
    api.add_job("earlier", [{"type": "Running", "status": "True"}])
    api.add_pod("trainkit-jobs", "earlier-worker-0", gpus=8, job="earlier")
    calls.clear()
    plan = nodegroup.plan_wake(_infra(name), "p5.48xlarge", 2, 2, Kube.connect(), eks)
    assert [op for op, _ in calls] == ["DescribeNodegroup"]  # planning changes nothing
    assert nodegroup.wake(plan) == (
        f"asked node group {name} for 3 node(s) (it had 1); the job stays Pending until they join (10 to 15 minutes)"
    )
    assert _scaling(eks, name) == {"minSize": 0, "maxSize": 4, "desiredSize": 3}
    calls.clear()
    assert nodegroup.wake(nodegroup.plan_wake(_infra(name), "p5.48xlarge", 1, 2, Kube.connect(), eks)) is None
    assert [op for op, _ in calls] == ["DescribeNodegroup"]


def test_credentials_that_may_not_list_every_namespace_ask_for_the_jobs_nodes_alone(
    moto, api, request, monkeypatch, capsys
):
    """A user whose Role reaches only the jobs' namespace: the API server answers the cluster-wide lists 403 (as
    RBAC does, with no partial answer); the submit still wakes the group for its own job, and says so."""
    from kubernetes.client.exceptions import ApiException

    def forbidden(kube, group):
        raise ApiException(status=403, reason="Forbidden")

    eks, _ = checked_eks(moto)
    name = request.node.name.replace("_", "-")[:56]
    gpu_nodegroup(eks, name, desired=0, maximum=4)
    monkeypatch.setattr(nodegroup, "list_activity", forbidden)
    plan = nodegroup.plan_wake(_infra(name), "p5.48xlarge", 2, 2, Kube.connect(), eks)
    assert plan.desired == 2 and "HTTP 403" in capsys.readouterr().err


def _scaling(eks, nodegroup: str) -> dict:
    return eks.describe_nodegroup(clusterName="trainkit", nodegroupName=nodegroup)["nodegroup"]["scalingConfig"]


def _record_make_up(name: str, guard: bool) -> None:
    """outputs.json as `make up PROFILE=aws` records it (the infra stack's outputs at defaults, or with
    idle_guard_minutes = null), and, with the guard, the guard image it pushed."""
    infra = _infra(name)
    guarded_outputs = {"idle_guard": infra.idle_guard, "ecr_repository_urls": {"idle-guard": GUARD_REPOSITORY}}
    outputs.save_outputs(
        {
            "gpu_instance_type": "p5.48xlarge",
            "region": "us-east-1",
            "gpu_nodegroup": infra.gpu_nodegroup,
            **(guarded_outputs if guard else {}),
        }
    )
    if guard:
        image = infra.idle_guard_image
        images.record(outputs.IDLE_GUARD_IMAGE_FILE, None, {"image": image, "tag": image.rsplit(":", 1)[1]})


@pytest.fixture(params=[True], ids=["guard-on"])
def guarded(moto, api, tmp_path, monkeypatch, request):
    """The launcher's side after `make up` (the guard on, as by default, unless a test parametrizes it off): infra
    outputs that name a node group at zero (maxSize 2) in moto's EKS; yields (EKS client, its calls, node group
    name)."""
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))
    test = request.node.name.split("[")[0].replace("_", "-")
    name = f"{test[:44]}-{'on' if request.param else 'off'}-{zlib.crc32(request.node.name.encode()):08x}"
    _record_make_up(name, request.param)
    eks, calls = checked_eks(moto)
    gpu_nodegroup(eks, name, desired=0)
    calls.clear()
    yield eks, calls, name


def _spec(**flags):
    return build_spec({"target": "eks", "model": "llama2-7b", "image": IMAGE, **flags})


def test_a_job_wider_than_the_groups_max_is_refused_and_wakes_nothing(guarded, api):
    eks, calls, name = guarded
    spec = _spec(nodes="4", global_batch_size="64", micro_batch_size="1")
    with pytest.raises(SpecError, match=r"grows to at most 2 \(its maxSize\): ask for fewer with --nodes 2, or raise "):
        backend.submit(spec, recipe(spec), eks=eks)
    assert [op for op, _ in calls] == ["DescribeNodegroup"] and _scaling(eks, name)["desiredSize"] == 0
    assert not api.jobs


@pytest.mark.parametrize("refusal", ["claim-pending", "already-running"])
def test_a_preflight_refusal_wakes_nothing(guarded, api, refusal):
    eks, calls, name = guarded
    spec = _spec()
    if refusal == "claim-pending":
        api.claim_phase, error = "Pending", r"FSx volume claim trainkit-jobs/fsx-shared is Pending, not Bound"
    else:
        api.add_job(spec.run.run_id.lower(), [{"type": "Created", "status": "True"}])
        error = rf"run {spec.run.run_id} already has a job on the cluster"
    with pytest.raises(SpecError, match=error):
        backend.submit(spec, recipe(spec), eks=eks)
    assert [op for op, _ in calls] == ["DescribeNodegroup"] and _scaling(eks, name)["desiredSize"] == 0


@pytest.mark.parametrize("guarded", [True, False], ids=["guard-on", "guard-off"], indirect=True)
def test_a_submit_wakes_the_group_after_its_checks_and_before_the_job(guarded, api, capsys, request):
    """`make up` creates the group empty, so a submit asks it for the job's nodes whether or not the idle guard runs;
    without the guard it says that the nodes stay up, and how to give them back."""
    eks, calls, name = guarded
    spec = _spec(nodes="2")
    submitted = backend.submit(spec, recipe(spec), eks=eks)
    assert submitted.startswith("submitted trainkit-jobs/")
    assert [op for op, _ in calls] == ["DescribeNodegroup", "UpdateNodegroupConfig"]
    assert _scaling(eks, name)["desiredSize"] == 2 and len(api.jobs) == 1
    (job,) = api.jobs.values()
    (policy,) = api.network_policies.values()  # made before the job, then owned by it (issue 49)
    ((secret_key, secret),) = api.secrets.items()  # the rendezvous key: 32 random bytes, owned by the job too
    assert re.fullmatch(r"[0-9a-f]{64}", secret["key"])
    assert api.secret_metadata[secret_key]["ownerReferences"] == policy["metadata"]["ownerReferences"]
    assert policy["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"],
        }
    ]
    noted = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: asked node group")]
    asked = (
        f"note: asked node group {name} for 2 node(s) (it had 0); the job stays Pending until they join "
        "(10 to 15 minutes)"
    )
    if "guard-on" in request.node.name:
        assert noted == [asked]
    else:
        assert noted == [
            f"{asked}; no idle guard runs on this group (idle_guard_minutes is null, or `make up` pushed no guard "
            "image), so they stay up and bill after the job ends until you run `aws eks update-nodegroup-config "
            f"--cluster-name trainkit --nodegroup-name {name} --scaling-config desiredSize=0`"
        ]


def test_a_job_the_api_server_refuses_after_the_wake_scales_the_group_back(guarded, api, capsys, monkeypatch):
    """Creating the job fails once the group was asked for its nodes: the submit asks for the old size again
    (after EKS took the scale-up: DescribeNodegroup until ACTIVE), says so, and fails with the API's error."""
    from kubernetes.client.exceptions import ApiException

    eks, calls, name = guarded
    refusal = status_body(403, "Forbidden", "pytorchjobs.kubeflow.org is forbidden")
    monkeypatch.setattr(api, "create_job", lambda namespace, body: (403, refusal))
    spec = _spec(nodes="2")
    with pytest.raises(ApiException, match="Forbidden"):
        backend.submit(spec, recipe(spec), eks=eks)
    ops = [op for op, _ in calls]
    assert ops == ["DescribeNodegroup", "UpdateNodegroupConfig", "DescribeNodegroup", "UpdateNodegroupConfig"]
    assert _scaling(eks, name)["desiredSize"] == 0 and not api.jobs
    assert not api.network_policies and not api.secrets  # what was made for the job's pods went with it (issue 49)
    assert capsys.readouterr().err.endswith(
        f"note: the job was not created, so node group {name} was asked for its 0 node(s) again\n"
    )


def test_a_job_created_while_the_group_is_at_zero_gets_its_nodes(history, moto, api, request):
    """A job the launcher did not wake for (created just after the guard's re-list, or a dry run's manifest applied
    with kubectl) waits at zero: the guard's next run scales the group up to what it needs."""
    eks, calls = checked_eks(moto)
    name = request.node.name.replace("_", "-")[:56]
    gpu_nodegroup(eks, name, desired=0)
    api.add_job("after-relist", [{"type": "Created", "status": "True"}], replicas=2)
    settings = idle_guard.GuardSettings("trainkit", name, WINDOW_S, STEP_S, history[1])
    decision = idle_guard.run_once(settings, Kube.connect(), eks, clock=lambda: history[0]["idle"])
    assert decision.desired == 2
    assert decision.reason == (
        f"PyTorchJob trainkit-jobs/after-relist waits for 2 node(s) besides the 0 that GPU pods are on: scaling {name} "
        "from 0 nodes to 2"
    )
    assert _scaling(eks, name) == {"minSize": 0, "maxSize": 2, "desiredSize": 2}
    status = api.configmaps[(cluster.PLATFORM_NAMESPACE, cluster.IDLE_GUARD)]["data"]
    assert status["decision"] == "scaled-up" and status["desired_size"] == "2"
    (event,) = api.events
    assert event["reason"] == "ScaledUp" and event["message"] == decision.reason


def test_a_gpu_pod_in_another_namespace_keeps_the_nodes(history, moto, api, request):
    api.add_pod("research", "notebook-0", gpus=1)
    decision, group, writes, status, _ = guard(history, moto, api, request, "idle")
    assert decision.desired is None and decision.reason == "pod research/notebook-0 has not ended"
    assert group["desiredSize"] == 2 and writes == [] and status["decision"] == "keep"


def test_a_job_unschedulable_longer_than_the_window_no_longer_keeps_the_nodes(history, moto, api, request):
    """A job that asks for what the group cannot give (here: more GPUs than a node has) waits unschedulable; once
    that has lasted longer than the window it no longer counts, an Event says so once, and idle GPUs go to zero."""
    now = history[0]["idle"]
    api.add_job("too-wide", [{"type": "Created", "status": "True"}])
    api.add_pod("trainkit-jobs", "too-wide-worker-0", gpus=16, job="too-wide", unschedulable_at=now - WINDOW_S - 1)
    decision, group, writes, status, _ = guard(history, moto, api, request, "idle")
    assert decision.scale_down and group["desiredSize"] == 0 and writes == ["UpdateNodegroupConfig"]
    assert decision.reason.endswith(
        "; PyTorchJob trainkit-jobs/too-wide not counted: unschedulable for 0.1 min, longer than the 0.0 min window"
    )
    assert status["unschedulable"] == "PyTorchJob trainkit-jobs/too-wide"
    scaled, noted = api.events
    assert scaled["reason"] == "ScaledToZero" and noted["type"] == "Warning"
    assert noted["reason"] == "UnschedulableNotCounted" and noted["message"].startswith(
        "PyTorchJob trainkit-jobs/too-wide has been unschedulable for 0.1 min, longer than the 0.0333333 min window: "
        "it no longer keeps node group"
    )
    eks, _ = checked_eks(moto)
    settings = idle_guard.GuardSettings("trainkit", group_name(request), WINDOW_S, STEP_S, history[1])
    again = idle_guard.run_once(settings, Kube.connect(), eks, clock=lambda: now + 1)
    assert again.desired is None and len(api.events) == 2  # at zero; the Event is not repeated


def test_a_job_with_a_running_pod_keeps_the_nodes_while_another_of_its_pods_is_unschedulable(
    history, moto, api, request
):
    """One worker runs (its GPUs idle: a restore, a rendezvous wait) and the other has been unschedulable for
    longer than the window: the job is not stuck, and its running pod keeps the nodes."""
    now = history[0]["idle"]
    api.add_job("half-placed", [{"type": "Running", "status": "True"}], replicas=2)
    api.add_pod("trainkit-jobs", "half-placed-worker-0", gpus=8, job="half-placed")
    api.add_pod("trainkit-jobs", "half-placed-worker-1", gpus=8, job="half-placed", unschedulable_at=now - WINDOW_S - 1)
    decision, group, writes, status, _ = guard(history, moto, api, request, "idle")
    assert decision.desired is None and decision.reason == "PyTorchJob trainkit-jobs/half-placed has not ended"
    assert group["desiredSize"] == 2 and writes == [] and "unschedulable" not in status and not api.events


def test_what_runs_and_what_waits_scale_the_group_to_their_sum_at_most_max(history, moto, api, request):
    """A 2-node job runs on the group's 2 nodes (maxSize 3) and a 2-node job waits: the group goes to 3, its
    maxSize; EKS (and so the stand-in) refuses a desired size above it."""
    from botocore.exceptions import ClientError

    api.add_nodes("p5.48xlarge", 1, gpus=8, efa=32)
    api.add_job("running", [{"type": "Running", "status": "True"}], replicas=2)
    for index, node in enumerate(n["metadata"]["name"] for n in api.nodes[:2]):
        api.add_pod("trainkit-jobs", f"running-worker-{index}", gpus=8, job="running", node=node)
    api.add_job("waiting", [{"type": "Created", "status": "True"}], replicas=2)
    decision, group, writes, _, _ = guard(history, moto, api, request, "idle", group_max=3)
    assert decision.desired == 3 and group["desiredSize"] == 3 and writes == ["UpdateNodegroupConfig"]
    assert decision.reason == (
        f"PyTorchJob trainkit-jobs/waiting waits for 2 node(s) besides the 2 that GPU pods are on: scaling "
        f"{group_name(request)} from 2 nodes to 3 (its maxSize; they need 4)"
    )
    eks, _ = checked_eks(moto)
    with pytest.raises(ClientError, match=r"InvalidParameterException.*desiredSize can't be greater than maxSize"):
        eks.update_nodegroup_config(
            clusterName="trainkit",
            nodegroupName=group_name(request),
            scalingConfig={"minSize": 0, "maxSize": 3, "desiredSize": 4},
        )


def test_status_says_how_long_utilisation_data_has_been_missing(history, moto, api, request):
    now = history[0]["missing"]
    since = idle_inputs.timestamp(now - 4200)
    earlier = {"decision": "keep", "missing_data_since": since}  # what the guard recorded 70 min ago and since
    metadata = {"name": cluster.IDLE_GUARD, "namespace": cluster.PLATFORM_NAMESPACE}
    api.create_configmap(
        cluster.PLATFORM_NAMESPACE, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": earlier}
    )
    decision, _, writes, status, _ = guard(history, moto, api, request, "missing")
    assert decision.missing_data and writes == [] and status["missing_data_since"] == since
    (alarm,) = api.events  # more than an hour while the group has nodes: the run fails (IdleGuardFailing)
    assert alarm["type"] == "Warning" and alarm["reason"] == "UtilisationDataMissing"
    assert alarm["message"] == decision.alarm and decision.alarm.startswith(
        f"utilisation data missing for 1 h 10 min while node group {group_name(request)} asks for 2 node(s), which "
        "the guard keeps until it is back (no DCGM_FI_DEV_GPU_UTIL series in the window: missing data counts as "
        f"activity): check the dcgm-exporter pods (`kubectl -n {cluster.MONITORING_NAMESPACE} get pods -o wide -l "
        "app.kubernetes.io/name=dcgm-exporter`"
    )
    assert idle_guard.describe(Kube.connect(), _infra("gpu"))[2] == (
        f"idle guard: no utilisation data for 1 h 10 min while 1 GPU node(s) are up (since {since}): the guard keeps "
        "them until DCGM_FI_DEV_GPU_UTIL reports again; check the GPU nodes' dcgm-exporter pods and Prometheus's "
        "dcgm target"
    )
    api.add_job("running", [{"type": "Running", "status": "True"}])  # kept for another reason: no longer missing
    decision, _, _, status, _ = guard(history, moto, api, request, "missing", suffix="-2")
    assert not decision.missing_data and "missing_data_since" not in status


def test_status_shows_the_guards_last_action_and_the_cost_per_hour(history, moto, api, request):
    decision, _, _, _, _ = guard(history, moto, api, request, "idle")
    assert decision.scale_down
    lines = idle_guard.describe(Kube.connect(), _infra("gpu"))
    # the suite prices from the shipped table (tests/conftest.py): its p5.48xlarge on-demand hour, with its date
    assert lines[0] == f"GPU nodes up: 1 x p5.48xlarge, about $55.04/h (on-demand, table of {table()['as_of']})"
    assert lines[1].startswith("idle guard: on (30 min window); last check ") and "scaled-down, no job for" in lines[1]
    assert "scaled to zero at 20" in lines[1]


# ---------------------------------------------------------------- the CronJob's command: main()


@pytest.fixture
def pod_env(moto, api, monkeypatch):
    """What the CronJob's pod has: AWS credentials and region in its environment (here moto's) and an API server."""
    for key, value in moto.env.items():
        monkeypatch.setenv(key, value)


def guard_args(history, nodegroup: str, *extra: str) -> list[str]:
    return [
        "--cluster=trainkit",
        f"--nodegroup={nodegroup}",
        f"--window-minutes={WINDOW_S / 60}",
        f"--step-seconds={STEP_S}",
        f"--prometheus={history[1]}",
        *extra,
    ]


def test_main_prints_one_line_for_keep_and_for_scale_down(history, moto, api, request, pod_env, capsys):
    name = request.node.name.replace("_", "-")[:56]
    gpu_nodegroup(moto.client("eks"), name)
    api.add_job("llama-run", [{"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}])
    at_idle_end = lambda: history[0]["idle"]  # noqa: E731
    assert idle_guard.main(guard_args(history, name), clock=at_idle_end) == 0
    assert capsys.readouterr() == ("idle guard: keep: PyTorchJob trainkit-jobs/llama-run has not ended\n", "")

    api.jobs.clear()
    assert idle_guard.main(guard_args(history, name), clock=at_idle_end) == 0
    out, err = capsys.readouterr()
    assert out.startswith("idle guard: scale down: ") and out.count("\n") == 1 and err == ""
    group = moto.client("eks").describe_nodegroup(clusterName="trainkit", nodegroupName=name)["nodegroup"]
    assert group["scalingConfig"]["desiredSize"] == 0
    assert api.configmaps[(cluster.PLATFORM_NAMESPACE, cluster.IDLE_GUARD)]["data"]["decision"] == "scaled-down"


def test_main_refuses_bad_arguments_with_exit_2(capsys):
    with pytest.raises(SystemExit) as exited:
        idle_guard.main(["--cluster=trainkit", "--nodegroup=gpu", "--window-minutes=0"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.endswith(
        "error: --window-minutes and --step-seconds must be positive (got 0 min, 60 s)\n"
    )


def test_main_fails_with_one_line_when_prometheus_is_unreachable(history, moto, api, request, pod_env, capsys):
    name = request.node.name.replace("_", "-")[:56]
    gpu_nodegroup(moto.client("eks"), name)
    unreachable = f"http://127.0.0.1:{free_port()}"
    args = [*guard_args(history, name), f"--prometheus={unreachable}"]
    assert idle_guard.main(args, clock=lambda: history[0]["idle"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"idle guard: failed: cannot query Prometheus at {unreachable} (")
    assert err.endswith("); nothing was changed\n")
    group = moto.client("eks").describe_nodegroup(clusterName="trainkit", nodegroupName=name)["nodegroup"]
    written = set(api.configmaps) - {("trainkit-jobs", "trainkit-etcd-issuer")}  # the platform's own, not the guard's
    assert group["scalingConfig"]["desiredSize"] == 2 and not written and not api.events


def test_the_cronjobs_command_fails_with_one_line_when_the_node_group_is_missing(history, moto, api, pod_env):
    """As the CronJob runs it: `python -m ...`, whose failed exit fails the Job (what IdleGuardFailing sees)."""
    gpu_nodegroup(moto.client("eks"), "gpu-other")  # the cluster exists; the named group does not
    result = subprocess.run(
        [sys.executable, "-m", "trainkit.backends.eks.idle_guard", *guard_args(history, "gpu-missing")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        "idle guard: failed: EKS DescribeNodegroup failed: ResourceNotFoundException: No node group found for name: "
        "gpu-missing. (check --cluster, --nodegroup and --region, and the guard's Pod Identity role in "
        "terraform/modules/gpu-nodegroup)\n"
    )


def test_nodes_that_never_joined_fail_the_run_after_an_hour_and_are_kept(history, moto, api, request, pod_env, capsys):
    """The group asks for 2 nodes and none has joined (bootstrap, AMI or EFA failure): no GPU node, no series, no
    job. That is missing data, kept; an hour on, each run records a Warning Event and exits 1 with one line, so
    its Job fails and IdleGuardFailing fires."""
    name = group_name(request)
    gpu_nodegroup(moto.client("eks"), name)
    api.nodes.clear()
    now = history[0]["missing"]
    metadata = {"name": cluster.IDLE_GUARD, "namespace": cluster.PLATFORM_NAMESPACE}
    earlier = {"decision": "keep", "missing_data_since": idle_inputs.timestamp(now - 3700)}
    api.create_configmap(
        cluster.PLATFORM_NAMESPACE, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": earlier}
    )
    assert idle_guard.main(guard_args(history, name), clock=lambda: now) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err == (
        f"idle guard: keep, failing: utilisation data missing for 1 h 1 min while node group {name} asks for 2 "
        f"node(s), which the guard keeps until it is back (node group {name} asks for 2 node(s) and no GPU node with "
        "GPUs has joined the cluster: nodes without data count as active): check why no GPU node joined: `kubectl "
        "get nodes -l trainkit/pool=gpu`, and the node group's health (`aws eks describe-nodegroup --cluster-name "
        f"trainkit --nodegroup-name {name} --query nodegroup.health`: bootstrap, AMI or EFA failures show there)\n"
    )
    assert _scaling(moto.client("eks"), name)["desiredSize"] == 2
    (event,) = api.events
    assert event["reason"] == "UtilisationDataMissing" and event["type"] == "Warning"
