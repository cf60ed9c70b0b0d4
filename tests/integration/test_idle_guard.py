"""The idle guard (trainkit/backends/eks/idle_guard.py) against a real Prometheus (Debian's 2.42) scraping a
dcgm-exporter stand-in, moto's EKS and the Kubernetes test API server (tests/helpers/idle_guard.py).

One Prometheus records a short history once, in phases: GPUs idle, one GPU busy (held by a job's pod, so its
series carries the pod labels), idle again, then no series at all (the exporter gone). Each test then runs the
guard with a fake clock set to the end of the phase it needs, with the real query over a 2 s window at 0.5 s steps
(the query and the decision are the production ones; only the window is short).
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from tests.helpers.aws import ThreadedMoto
from tests.helpers.containers import free_port
from tests.helpers.idle_guard import DcgmStandIn, GuardCluster, checked_eks, gpu_nodegroup
from tests.helpers.paths import REPO
from trainkit.backends.eks import cluster, idle_guard
from trainkit.backends.eks.kube import Kube
from trainkit.services.prometheus import GPU_JOB, PrometheusServer, write_targets

WINDOW_S, STEP_S = 2.0, 0.5
PHASE_S = WINDOW_S + STEP_S + 0.4  # the first step looks one step back from the window's start


def _has_samples(prometheus: PrometheusServer, count: int) -> bool:
    query = urllib.parse.urlencode({"query": f"count({idle_guard.UTIL_METRIC})"})
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


def guard(history, moto, api, request, at: str, offset: float = 0.0, group_min: int = 0, suffix: str = ""):
    """Run the guard once at the end of phase `at` (+ offset); returns its decision, the node group after it, the
    EKS calls it made and the status it recorded."""
    ends, prometheus = history
    eks, calls = checked_eks(moto)
    name = request.node.name.replace("_", "-")[:56] + suffix
    gpu_nodegroup(eks, name, desired=2, minimum=group_min)
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
    assert not decision.scale_down and decision.reason == "job llama-run has not ended"
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
    return idle_guard.timestamp(epoch)


def _infra(nodegroup: str):
    from trainkit.infra.outputs import InfraOutputs

    guard = {"cluster_name": "trainkit", "region": "us-east-1", "nodegroup": nodegroup, "window_minutes": 30}
    return InfraOutputs("p5.48xlarge", None, "us-east-1", recorded=True, idle_guard=guard)


def test_a_submit_scales_a_group_at_zero_back_up_and_leaves_one_with_nodes(moto, request):
    eks, calls = checked_eks(moto)
    name = request.node.name.replace("_", "-")[:56]
    gpu_nodegroup(eks, name, desired=0)
    calls.clear()
    note = idle_guard.wake(_infra(name), nodes=4, eks=eks)  # more than maxSize 2: asks for 2
    assert "asked for 2 node(s) again" in note
    assert eks.describe_nodegroup(clusterName="trainkit", nodegroupName=name)["nodegroup"]["scalingConfig"] == {
        "minSize": 0,
        "maxSize": 2,
        "desiredSize": 2,
    }
    calls.clear()
    assert idle_guard.wake(_infra(name), nodes=1, eks=eks) is None
    assert [op for op, _ in calls] == ["DescribeNodegroup"]


def test_status_shows_the_guards_last_action_and_the_cost_per_hour(history, moto, api, request):
    decision, _, _, _, _ = guard(history, moto, api, request, "idle")
    assert decision.scale_down
    lines = idle_guard.describe(Kube.connect(), _infra("gpu"))
    assert lines[0] == (
        "GPU nodes up: 1 x p5.48xlarge, about $98.32/h (on-demand us-east-1, 2023-07-27 list prices (pre June-2025 "
        "reduction))"
    )
    assert (
        lines[1].startswith("idle guard: on (30 min window); last check ")
        and "scaled-down, no trainkit job" in lines[1]
    )
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
    assert capsys.readouterr() == ("idle guard: keep: job llama-run has not ended\n", "")

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
    assert group["scalingConfig"]["desiredSize"] == 2 and not api.configmaps and not api.events


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
