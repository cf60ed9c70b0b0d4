"""The idle guard's own image (containers/train/Dockerfile, stage `guard`): what the guard loads fits in it, and
`make up PROFILE=aws` builds and pushes it between the infra and the platform stack, as a user runs it: `invoke
infra.up` with real Terraform on stand-in stacks (built-in resources, the real platform variables), ECR in the AWS
emulator (moto server) and the buildah stand-in (tests/helpers/fake_buildah.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import boto3
import pytest

from tests.helpers.aws import FAKE_AWS, moto_server
from tests.helpers.fake_buildah import on_path
from tests.helpers.paths import REPO
from tests.helpers.product import invoke
from trainkit.infra import images, outputs

LOADED = r"""
import ast, importlib, json, sys
from importlib.metadata import packages_distributions

before = set(sys.modules)
import trainkit.backends.eks.idle_guard
import trainkit.backends.eks.etcd_issuer
import trainkit.backends.eks.fsx

# What a run imports inside the guard's functions (the Kubernetes client, boto3): imported here as well.
deferred = set()
for name in [m for m in sys.modules if m.startswith("trainkit.backends.eks.")]:
    for function in ast.walk(ast.parse(open(sys.modules[name].__file__).read())):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    deferred.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    deferred.add(node.module)
for name in sorted(deferred):
    importlib.import_module(name)
top = {m.partition(".")[0] for m in set(sys.modules) - before}
owners = packages_distributions()
dists = sorted({d for m in top for d in owners.get(m, [])})
print(json.dumps({"deferred": sorted(deferred), "top": sorted(top), "dists": dists}))
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_guard_and_the_etcd_issuer_load_none_of_trainkits_dependencies_their_image_leaves_out():
    """The image holds trainkit without its dependencies plus GUARD_PACKAGES: a guard or an etcd issuer (the platform
    runs both in it) that imported any other of pyproject's dependencies (torch, numpy, transformers ...) would fail
    there at its first run."""
    done = subprocess.run([sys.executable, "-c", LOADED], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert {"boto3", "kubernetes"} <= set(loaded["deferred"])  # the walk found the run's own imports
    assert "cryptography" in loaded["top"]  # the issuer's certificates
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    left_out = {canonical(re.match(r"[A-Za-z0-9._-]+", spec)[0]) for spec in declared}
    left_out -= {canonical(name) for name in images.GUARD_PACKAGES}
    assert {"torch", "numpy", "transformers"} <= left_out
    assert not left_out & {canonical(d) for d in loaded["dists"]}, loaded
    assert not {"torch", "numpy", "transformers"} & set(loaded["top"])


INFRA = """
terraform {
  backend "local" {}
}

variable "region" {
  type = string
}

resource "terraform_data" "cluster" {
  input = "tk-guard"
}

output "cluster_name" {
  value = terraform_data.cluster.output
}

output "region" {
  value = var.region
}

output "cluster_endpoint" {
  value = "https://127.0.0.1:6443"
}

output "cluster_certificate_authority_data" {
  value = ""
}

output "ecr_repository_urls" {
  value = { train = "REGISTRY/trainkit/train", "idle-guard" = "REGISTRY/trainkit/idle-guard" }
}

output "idle_guard" {
  value = {
    cluster_name = "tk-guard", region = var.region, nodegroup = "gpu", window_minutes = 30,
    namespace = "trainkit-system", service_account = "trainkit-idle-guard"
  }
}
"""
# The platform stand-in declares the real stack's variables (its variables.tf) and keeps the guard's image.
PLATFORM = """
terraform {
  backend "local" {}
}

resource "terraform_data" "idle_guard" {
  input = var.idle_guard_image
}

output "idle_guard_image" {
  value = terraform_data.idle_guard.output
}
"""
REGISTRY = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
GUARD_REPOSITORY = f"{REGISTRY}/trainkit/idle-guard"


@pytest.fixture
def cloud(tmp_path):
    """The emulator with the stack's two repositories, the stand-in stacks, and what `invoke infra.up` needs."""
    stacks = tmp_path / "terraform" / "stacks"
    (stacks / "infra").mkdir(parents=True)
    (stacks / "infra" / "main.tf").write_text(INFRA.replace("REGISTRY", REGISTRY))
    (stacks / "platform").mkdir()
    (stacks / "platform" / "main.tf").write_text(PLATFORM)
    shutil.copy(REPO / "terraform" / "stacks" / "platform" / "variables.tf", stacks / "platform" / "variables.tf")
    var_file = tmp_path / "test.tfvars"
    var_file.write_text('region = "us-east-1"\n')
    # No builder: git and terraform only (this machine's /usr/bin has a real buildah).
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("git", "terraform"):
        (tools / tool).symlink_to(shutil.which(tool))
    with moto_server(tmp_path / "moto.log") as endpoint:
        keys = {k.lower(): v for k, v in FAKE_AWS.items() if "KEY" in k}
        ecr = boto3.client("ecr", endpoint_url=endpoint, region_name="us-east-1", **keys)
        for name in ("trainkit/train", "trainkit/idle-guard"):
            ecr.create_repository(repositoryName=name, imageTagMutability="IMMUTABLE")
        env = {
            **FAKE_AWS,
            "AWS_ENDPOINT_URL": endpoint,
            "TRAINKIT_STATE_DIR": str(tmp_path / "state"),
            "TRAINKIT_TERRAFORM_DIR": str(tmp_path / "terraform"),
            "PATH": str(tools),
            "FAKE_BUILDAH_LOG": str(tmp_path / "buildah.jsonl"),
        }
        yield env, ecr, var_file, tmp_path


def platform_image(env: dict) -> str | None:
    """The guard image the platform stand-in was applied with (its state's output)."""
    state = json.loads((Path(env["TRAINKIT_STATE_DIR"]) / "aws" / "platform" / "terraform.tfstate").read_text())
    return state["outputs"].get("idle_guard_image", {}).get("value")


def test_make_up_builds_and_pushes_the_guard_before_the_platform_and_skips_it_without_a_builder(cloud):
    env, ecr, var_file, tmp_path = cloud
    log = tmp_path / "buildah.jsonl"
    up = ["infra.up", "--profile", "aws", "--yes", "--var-file", str(var_file)]

    bare = invoke(*up, env=env)
    assert bare.returncode == 0, bare.stdout + bare.stderr
    (note,) = [line for line in bare.stdout.splitlines() if line.startswith("note:") and "idle guard" in line]
    not_built = "note: the idle guard's image was not built (no image builder here)"
    assert note.startswith(f"{not_built}, so neither the etcd issuer nor the idle guard runs")
    assert "install Docker with buildx" in note and "buildah" in note
    assert not log.exists() and platform_image(env) is None  # the platform stack got no guard image: no CronJob

    tag = images.content_tag(REPO, f"{images.GUARD}-{outputs.NODE_ARCHITECTURE}")
    assert tag.startswith("guard-amd64-")  # the nodes' architecture, whatever this machine's is
    built = invoke(*up, "--stack", "platform", env={**env, "PATH": on_path(tmp_path / "bin") + f":{env['PATH']}"})
    assert built.returncode == 0, built.stdout + built.stderr
    calls = [json.loads(line)["argv"] for line in log.read_text().splitlines()]
    assert [call[0] for call in calls] == ["bud", "login", "push"]
    bud = calls[0]
    assert bud[bud.index("--target") + 1] == "guard" and not [arg for arg in bud if arg.startswith("FLAVOR=")]
    assert bud[bud.index("--platform") + 1] == "linux/amd64"
    context = tmp_path / "state" / "image-context-guard" / "dist"
    requirements = (context / images.GUARD_REQUIREMENTS).read_text().split()
    assert requirements == images.guard_requirements(REPO) and "kubernetes==36.0.0" in requirements
    assert len(list(context.glob("trainkit-*.whl"))) == 1
    assert calls[2][-1] == f"docker://{GUARD_REPOSITORY}:{tag}"
    (pushed,) = ecr.describe_images(repositoryName="trainkit/idle-guard")["imageDetails"]
    assert pushed["imageTags"] == [tag] and not ecr.describe_images(repositoryName="trainkit/train")["imageDetails"]
    # The platform stack was applied after the push, with the pushed image; the training image's record is untouched.
    assert platform_image(env) == f"{GUARD_REPOSITORY}:{tag}"
    assert f"idle guard image {GUARD_REPOSITORY}:{tag} ({pushed['imageDigest']}): pushed" in built.stdout
    assert not (tmp_path / "state" / "aws" / outputs.PUSHED_IMAGE_FILE).exists()

    again = invoke(*up, "--stack", "platform", env={**env, "PATH": on_path(tmp_path / "bin") + f":{env['PATH']}"})
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"idle guard image {GUARD_REPOSITORY}:{tag}: already in ECR, not built again" in again.stdout
    assert len(log.read_text().splitlines()) == 3 and platform_image(env) == f"{GUARD_REPOSITORY}:{tag}"


def test_a_failed_guard_image_still_applies_the_platform_then_fails_and_says_how_to_retry(cloud):
    """The infra stack's GPU nodes are up: a guard image that fails to build or push must not leave them without the
    platform (device plugins, operator, FSx claim). The platform stack is applied with the guard image recorded
    before (or none: no CronJob), then `make up` fails with the error and what to run once it is fixed."""
    env, ecr, var_file, tmp_path = cloud
    up = ["infra.up", "--profile", "aws", "--yes", "--var-file", str(var_file)]
    builder = {**env, "PATH": on_path(tmp_path / "bin") + f":{env['PATH']}"}
    tag = images.content_tag(REPO, f"{images.GUARD}-{outputs.NODE_ARCHITECTURE}")
    retry = "fix that and run `invoke infra.up --profile aws --stack platform`"

    pushed = invoke(*up, env={**builder, "FAKE_BUILDAH_FAIL": "push"})  # a fresh stack: no guard image before
    assert pushed.returncode == 2, pushed.stdout + pushed.stderr
    assert "cluster tk-guard is up" in pushed.stdout, pushed.stderr  # the platform stack was applied ...
    assert platform_image(env) is None  # ... with no guard image: no CronJob
    error = f"error: the idle guard's image {tag} was not built and pushed (pushing {GUARD_REPOSITORY}:{tag} failed"
    (line,) = [line for line in pushed.stdout.splitlines() if line.startswith(error)]
    assert line.endswith("so neither the etcd issuer nor the idle guard runs; applying the platform stack all the same")
    last = pushed.stderr.strip().splitlines()[-1]  # after the builder's own error
    assert last.startswith(error) and retry in last

    before = f"{GUARD_REPOSITORY}:guard-amd64-0123456789ab"
    record = tmp_path / "state" / "aws" / outputs.IDLE_GUARD_IMAGE_FILE
    record.write_text(json.dumps({"image": before, "tag": "guard-amd64-0123456789ab", "digest": "sha256:00"}))
    built = invoke(*up, "--stack", "platform", env={**builder, "FAKE_BUILDAH_FAIL": "bud"})
    assert built.returncode == 2, built.stdout + built.stderr
    failed = f"the image build failed (exit 1); the builder's output is above), so the platform keeps running {before}"
    assert failed in built.stderr and retry in built.stderr
    assert platform_image(env) == before  # the platform stack was applied, with the guard's last image
    calls = [json.loads(line)["argv"][0] for line in (tmp_path / "buildah.jsonl").read_text().splitlines()]
    assert calls == ["bud", "login", "push", "bud"]
    assert not ecr.describe_images(repositoryName="trainkit/idle-guard")["imageDetails"]
