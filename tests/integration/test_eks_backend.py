"""The EKS backend against a local Kubernetes API server (tests/helpers/kube_api.py).

Preflight failures each end in one sentence naming the fix; the end-to-end test submits a real
2-node job whose pods run here (the pod entry point, torchrun, an etcd rendezvous, training on CPU),
restarts a worker, follows status and logs, and stops it.
"""

from __future__ import annotations

import json
import signal
import socket

import pytest
from moto import mock_aws

from tests.helpers.kube_api import FakeCluster
from tests.helpers.product import invoke
from trainkit.backends import eks
from trainkit.backends import job_from_flags as build_spec
from trainkit.backends.eks import preflight
from trainkit.backends.eks.kube import Kube
from trainkit.errors import SpecError
from trainkit.services import EtcdServer

IMAGE = "registry.example.com/trainkit/train:test"  # not ECR: the image check only notes it
TOKEN = "hf_never_print_me_42"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    with FakeCluster(tmp_path / "cluster") as api:
        api.add_nodes("p5.48xlarge", 2, gpus=8, efa=32)
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig()))
        monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))
        yield api


def spec_of(**flags):
    return build_spec({"target": "eks", "model": "llama2-7b", "image": IMAGE, **flags})


def check(**flags) -> list[str]:
    return preflight.preflight(Kube.connect(), spec_of(**flags))


def test_preflight_passes_on_a_ready_cluster(fake):
    assert check(nodes="2") == [f"image {IMAGE} is not in ECR; not checked (the nodes must be able to pull it)"]


def test_unreachable_cluster(fake, monkeypatch, tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = json.loads(fake.kubeconfig().read_text())
    config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{port}"
    path = tmp_path / "dead-kubeconfig"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    with pytest.raises(
        SpecError, match=rf"cannot reach the Kubernetes API at http://127.0.0.1:{port} .*run `make up PROFILE=aws`"
    ):
        check()


def test_no_kubeconfig(fake, monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(SpecError, match=r"no kubeconfig at .*missing: run `make up PROFILE=aws` \(it writes one\)"):
        check()


def test_operator_missing(fake):
    fake.operator_installed = False
    with pytest.raises(SpecError, match=r"no PyTorchJob kind \(kubeflow.org/v1\): run `make up PROFILE=aws`"):
        check()


def test_not_enough_gpu_nodes(fake):
    with pytest.raises(
        SpecError,
        match=r"needs 3 p5.48xlarge node\(s\) with 8 GPUs and 32 EFA devices allocatable each "
        r"and the cluster has 2: raise gpu_desired_nodes .* or ask for fewer with --nodes 2",
    ):
        check(nodes="3", global_batch_size="48", micro_batch_size="1")
    assert (
        "the job starts at 2 and grows" in check(nodes="1:3", global_batch_size="48", micro_batch_size="1")[0]
    )  # elastic: the minimum is enough


def test_nodes_of_another_type_do_not_count(fake):
    with pytest.raises(SpecError, match=r"needs 1 p4d.24xlarge node\(s\) .* the cluster has 0"):
        check(instance_type="p4d.24xlarge")


@pytest.mark.parametrize("phase, shown", [(None, "missing"), ("Pending", "Pending")])
def test_fsx_claim_not_bound(fake, phase, shown):
    fake.claim_phase = phase
    with pytest.raises(
        SpecError, match=rf"FSx volume claim trainkit-jobs/fsx-shared is {shown}, not Bound: run `make up"
    ):
        check()


def test_pretrained_needs_the_token_secret(fake):
    with pytest.raises(SpecError, match=r"no Secret trainkit-jobs/hf-token: run `invoke secrets.hf-token` first"):
        check(init="pretrained")
    fake.secrets[("trainkit-jobs", "hf-token")] = {"token": TOKEN}
    check(init="pretrained")


def test_a_running_job_of_the_same_run_is_refused(fake):
    spec = spec_of()
    eks.submit(spec)
    with pytest.raises(
        SpecError, match=rf"run {spec.run.run_id} already has a job .* `invoke stop --run-id {spec.run.run_id}`"
    ):
        check()


@mock_aws
def test_image_must_exist_in_ecr(fake, monkeypatch):
    import boto3

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    ecr = boto3.client("ecr", region_name="us-east-1")
    url = ecr.create_repository(repositoryName="trainkit/train")["repository"]["repositoryUri"]
    spec = spec_of(image=f"{url}:v1")
    with pytest.raises(SpecError, match=rf"image {url}:v1 is not in ECR \(ImageNotFoundException\): build and push it"):
        preflight.check_image(spec, ecr)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"digest": "sha256:" + "0" * 64, "size": 1, "mediaType": "application/json"},
            "layers": [],
        }
    )
    ecr.put_image(repositoryName="trainkit/train", imageManifest=manifest, imageTag="v1")
    assert preflight.check_image(spec, ecr) is None
    with pytest.raises(SpecError, match=r"RepositoryNotFoundException"):
        preflight.check_image(spec_of(image=url.replace("trainkit/train", "nope") + ":v1"), ecr)


def test_without_recorded_outputs_there_is_no_image_to_run(fake):
    spec = build_spec({"target": "eks", "model": "llama2-7b"})
    with pytest.raises(SpecError, match=r"no training image: run `make up PROFILE=aws` .* or pass --image"):
        preflight.check_image(spec)


def test_secret_from_a_file_never_printed(fake, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = {"HF_TOKEN": ""}
    first = invoke("secrets.hf-token", "--file", str(token_file), env=env)
    assert first.returncode == 0, first.stderr
    assert "created Secret trainkit-jobs/hf-token" in first.stdout
    again = invoke("secrets.hf-token", "--file", str(token_file), env=env)
    assert "replaced Secret" in again.stdout
    assert fake.secrets[("trainkit-jobs", "hf-token")] == {"token": TOKEN}
    assert TOKEN not in first.stdout + first.stderr + again.stdout + again.stderr


def test_status_logs_stop_without_a_job_say_what_to_do(fake):
    result = invoke("status")
    assert result.returncode == 2
    assert (
        "no job from trainkit in namespace trainkit-jobs: submit one with `invoke train --target eks`" in result.stderr
    )


@pytest.mark.slow
def test_submit_status_logs_restart_stop_end_to_end(fake, tmp_path):
    """A real 2-node job: pods run the pod entry point here, meet at a real etcd, lose a worker and go on."""
    with EtcdServer(tmp_path / "etcd") as etcd:
        flags = [
            "--target",
            "eks",
            "--model",
            "llama2-tiny",
            "--image",
            IMAGE,
            "--nodes",
            "2",
            "--nproc",
            "1",
            "--rdzv",
            "etcd",
            "--rdzv-endpoint",
            etcd.endpoint,
            "--metrics-port",
            "0",
            "--steps",
            "24",
            "--checkpoint-interval",
            "4",
            "--run-id",
            "e2e",
        ]
        submitted = invoke("train", *flags)
        assert submitted.returncode == 0, submitted.stderr
        assert "submitted trainkit-jobs/e2e: 2 x p5.48xlarge, 1 processes each, rendezvous etcd" in submitted.stdout
        run = fake.fsx / "runs" / "e2e"
        metrics = run / "metrics.jsonl"
        fake.wait(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 6, 120, "6 training steps")
        fake.pod("e2e-worker-1").kill(signal.SIGKILL)  # the node's agent and its worker die at once
        fake.wait(lambda: fake.pod("e2e-worker-1").restarts == 1, 30, "the kubelet to restart worker 1")
        status = invoke("status", "--run-id", "e2e")
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith("job trainkit-jobs/e2e (run e2e): ")
        assert "e2e-worker-1 exited with code -9; restarting" in status.stdout
        rows = {
            line.split()[0]: line.split() for line in status.stdout.splitlines()[1:] if line.strip().startswith("e2e-")
        }
        assert rows["e2e-worker-1"][2] == "1" and rows["e2e-worker-0"][2] == "0"  # restarts column
        assert rows["e2e-worker-0"][3] == fake.nodes[0]["metadata"]["name"]
        job = fake.jobs[("trainkit-jobs", "e2e")]
        fake.wait(lambda: job["status"]["conditions"][-1]["type"] == "Succeeded", 240, "the job to succeed")
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps"] == 24
        assert json.loads((run / "spec.json").read_text())["placement"]["target"] == "eks"
        assert (run / "logs" / "e2e-worker-0").is_dir() and (run / "logs" / "e2e-worker-1").is_dir()
        events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
        assert any(e["event"] == "resume" for e in events)  # the group re-formed after the loss

        leader = invoke("logs", "--run-id", "e2e")
        assert leader.returncode == 0, leader.stderr
        assert leader.stdout.startswith("==> e2e-worker-") and "(leader)" in leader.stdout.splitlines()[0]
        assert "group_rank=0" in leader.stdout and "summary: runs/e2e/summary.json" in leader.stdout
        rank1 = invoke("logs", "--run-id", "e2e", "--rank", "1")
        lines = rank1.stdout.splitlines()
        assert "(rank 1)" in lines[0] and all(line.startswith("[default0]:") for line in lines[1:])
        follow = invoke("logs", "--run-id", "e2e", "-f")  # the pod has ended, so follow returns
        assert follow.returncode == 0 and "summary: runs/e2e/summary.json" in follow.stdout

        stopped = invoke("stop", "--run-id", "e2e")
        assert stopped.returncode == 0 and "deleted job trainkit-jobs/e2e" in stopped.stdout
        assert ("trainkit-jobs", "e2e") not in fake.jobs and (run / "summary.json").exists()  # outputs stay
        assert invoke("status", "--run-id", "e2e").returncode == 2
