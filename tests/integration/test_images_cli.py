"""`invoke images.*` as a user runs them: the dry run of a GPU build, and a push to ECR in the AWS emulator (moto
server) whose login takes the password on stdin only, records the tag, and makes it the default image of the
next `invoke train --target eks`."""

from __future__ import annotations

import json

import boto3
import pytest

from tests.helpers.aws import FAKE_AWS, moto_server
from tests.helpers.fake_buildah import on_path
from tests.helpers.paths import REPO
from tests.helpers.product import invoke
from trainkit.infra import images

REPOSITORY = "trainkit/train"
ECR_URL = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/{REPOSITORY}"


def test_gpu_dry_run_prints_base_pins_tag_and_the_exact_command(tmp_path):
    args = ["--target", "gpu", "--tag", "gpu-dry", "--dry-run"]
    log = tmp_path / "buildah.jsonl"
    result = invoke("images.build", *args, env={"PATH": fake_path(tmp_path), "FAKE_BUILDAH_LOG": str(log)})
    assert result.returncode == 0, result.stdout + result.stderr
    pins = images.pins(REPO / images.DOCKERFILE)
    lines = result.stdout.splitlines()
    assert lines[0] == f"image {images.LOCAL_NAME}:gpu-dry (gpu), built with buildah"
    assert f"  base     {pins['CUDA_BASE']}" in lines
    assert f"EFA_INSTALLER_VERSION={pins['EFA_INSTALLER_VERSION']}" in result.stdout
    assert f"  torch    {images.TORCH_LOCK}'s wheels only, hash-checked (pip --require-hashes)" in lines
    (command,) = [line.removeprefix("  command  ") for line in lines if line.startswith("  command  ")]
    assert command.startswith("buildah bud --layers --file ") and "--build-arg FLAVOR=gpu" in command
    assert "--platform linux/amd64" in command and "  platform linux/amd64" in lines  # the GPU nodes', not this one's
    assert not log.exists() and not any(line.startswith("built ") for line in lines)  # nothing ran buildah


def fake_path(tmp_path) -> str:
    """PATH with a `buildah` (tests/helpers/fake_buildah.py) first, and no docker."""
    return on_path(tmp_path / "bin")


@pytest.fixture
def emulator(tmp_path):
    with moto_server(tmp_path / "moto.log") as endpoint:
        env = {"AWS_ENDPOINT_URL": endpoint, **FAKE_AWS, "TRAINKIT_STATE_DIR": str(tmp_path / "state")}
        keys = {k.lower(): v for k, v in FAKE_AWS.items() if "KEY" in k}
        ecr = boto3.client("ecr", endpoint_url=endpoint, region_name="us-east-1", **keys)
        ecr.create_repository(repositoryName=REPOSITORY, imageTagMutability="IMMUTABLE")
        state = tmp_path / "state" / "aws"
        state.mkdir(parents=True)
        outputs = {"gpu_instance_type": "p5.48xlarge", "region": "us-east-1", "ecr_repository_urls": {"train": ECR_URL}}
        (state / "outputs.json").write_text(json.dumps(outputs))
        log = tmp_path / "buildah.jsonl"
        yield {**env, "PATH": fake_path(tmp_path), "FAKE_BUILDAH_LOG": str(log)}, ecr, log, state


def test_push_logs_in_on_stdin_records_the_tag_and_the_next_eks_job_uses_it(emulator):
    env, ecr, log, state = emulator
    result = invoke("images.push", "--tag", "gpu-0123456789ab", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [call["argv"][0] for call in calls] == ["login", "push"]
    login, push = calls
    password = login["stdin"]
    assert password and login["argv"][-1] == "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    # The password went to stdin and nowhere else: not in any argv, not in what the command printed.
    assert not any(password in arg for call in calls for arg in call["argv"])
    assert password not in result.stdout + result.stderr
    assert push["argv"][-2:] == [f"{images.LOCAL_NAME}:gpu-0123456789ab", f"docker://{ECR_URL}:gpu-0123456789ab"]
    (described,) = ecr.describe_images(repositoryName=REPOSITORY)["imageDetails"]
    recorded = json.loads((state / "image.json").read_text())
    digest = described["imageDigest"]
    assert recorded == {"image": f"{ECR_URL}:gpu-0123456789ab", "tag": "gpu-0123456789ab", "digest": digest}
    assert f"{ECR_URL}:gpu-0123456789ab ({described['imageDigest']}): pushed" in result.stdout

    job = invoke("train", "--model", "llama2-7b", "--target", "eks", "--dry-run", env=env)
    assert job.returncode == 0, job.stdout + job.stderr
    assert f"image: {ECR_URL}:gpu-0123456789ab" in job.stdout

    again = invoke("images.push", "--tag", "gpu-0123456789ab", env=env)  # an immutable tag is not pushed twice
    assert again.returncode == 0 and "already in ECR" in again.stdout, again.stdout + again.stderr
    assert [json.loads(line)["argv"][0] for line in log.read_text().splitlines()] == ["login", "push", "login"]


def test_push_without_a_recorded_stack_or_build_says_what_to_run_first(tmp_path):
    env = {**FAKE_AWS, "TRAINKIT_STATE_DIR": str(tmp_path / "state"), "PATH": fake_path(tmp_path)}
    result = invoke("images.push", env=env)
    assert result.returncode == 2 and "run `invoke images.build --target gpu` first" in result.stdout + result.stderr
    result = invoke("images.push", "--tag", "gpu-x", env=env)
    assert result.returncode == 2 and "run `make up PROFILE=aws` first" in result.stdout + result.stderr
