"""The EKS backend against a local Kubernetes API server (tests/helpers/kube_api.py, the `fake` fixture).

Preflight failures each end in one sentence naming the fix; `invoke secrets.hf-token` and `invoke status`
against the cluster. A real job through the same server: tests/e2e/test_eks_backend_runs.py.
"""

from __future__ import annotations

import json
import socket

import pytest
from moto import mock_aws

from tests.helpers.eks import IMAGE
from tests.helpers.product import invoke
from trainkit.backends import job_from_flags as build_spec
from trainkit.backends.eks import backend as eks
from trainkit.backends.eks import preflight
from trainkit.backends.eks.kube import Kube
from trainkit.errors import SpecError
from trainkit.workloads.recipe import recipe

TOKEN = "hf_never_print_me_42"


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
    eks.submit(spec, recipe(spec))
    with pytest.raises(
        SpecError, match=rf"run {spec.run.run_id} already has a job .* `invoke stop --run-id {spec.run.run_id}`"
    ):
        check()


DIGEST = "sha256:" + "2" * 64


@mock_aws
def test_image_must_exist_in_ecr(fake, monkeypatch):
    import boto3

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    ecr = boto3.client("ecr", region_name="us-east-1")
    created = ecr.create_repository(repositoryName="trainkit/train", imageTagMutability="IMMUTABLE")  # as ours
    url = created["repository"]["repositoryUri"]
    spec = spec_of(image=f"{url}:v1")
    with pytest.raises(SpecError, match=rf"image {url}:v1 is not in ECR \(ImageNotFoundException\): build and push it"):
        preflight.check_image(spec, ecr)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"digest": "sha256:" + "0" * 64, "size": 1, "mediaType": "application/json"},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "size": 1, "digest": DIGEST}],
        }
    )
    ecr.put_image(repositoryName="trainkit/train", imageManifest=manifest, imageTag="v1")
    assert preflight.check_image(spec, ecr) is None
    # the image now also carries the run's tag, which the lifecycle policy keeps (terraform/modules/ecr)
    (image,) = ecr.describe_images(repositoryName="trainkit/train")["imageDetails"]
    assert sorted(image["imageTags"]) == sorted(["v1", f"run-{spec.run.run_id}"])
    assert preflight.check_image(spec, ecr) is None  # submitting again: the tag is there already
    other = manifest.replace(DIGEST, "sha256:" + "1" * 64)  # a resumed run on another image: its first one stays kept
    ecr.put_image(repositoryName="trainkit/train", imageManifest=other, imageTag="v2")
    note = preflight.check_image(spec_of(image=f"{url}:v2"), ecr)
    assert note and f"run-{spec.run.run_id} already tags the image this run started with" in note
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
