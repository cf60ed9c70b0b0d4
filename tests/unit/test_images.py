"""The training image's build plan and ECR push, in-process: tags, builder choice, the dry run's content, the
login token, and the default image a push leaves for `--target eks`."""

from __future__ import annotations

import base64
import json
import re
import subprocess

import pytest

from tests.helpers.eks import ECR
from trainkit.errors import SpecError
from trainkit.infra import images, outputs


def git_answers(status: str, diff: str = "", commit: str = "0123456789abcdef0123"):
    def run(command, **_):
        answer = {"rev-parse": commit + "\n", "status": status, "diff": diff}[command[3]]
        return subprocess.CompletedProcess(command, 0, answer, "")

    return run


def test_tags_are_the_commit_and_a_dirty_tree_gets_a_hash_of_its_changes(tmp_path):
    (tmp_path / "new.txt").write_text("a")
    clean = images.content_tag(tmp_path, "gpu", git_answers(""))
    assert clean == "gpu-0123456789ab"
    first = images.content_tag(tmp_path, "cpu", git_answers(" M a.py\n", diff="one"))
    second = images.content_tag(tmp_path, "cpu", git_answers(" M a.py\n", diff="two"))
    untracked = images.content_tag(tmp_path, "cpu", git_answers(" M a.py\n?? new.txt\n", diff="one"))
    assert first.startswith("cpu-0123456789ab-dirty-") and len({first, second, untracked}) == 3
    (tmp_path / "new.txt").write_text("b")  # the same untracked file with other content: another tag
    assert images.content_tag(tmp_path, "cpu", git_answers(" M a.py\n?? new.txt\n", diff="one")) != untracked


def fake_tools(available: set[str], buildx_ok: bool = True, daemon_ok: bool = True):
    def which(name):
        return f"/usr/bin/{name}" if name in available else None

    def run(command, **_):
        ok = buildx_ok if command[1] == "buildx" else daemon_ok
        return subprocess.CompletedProcess(command, 0 if ok else 1, "", "")

    return run, which


@pytest.mark.parametrize(
    ("available", "daemon_ok", "chosen"),
    [
        ({"docker", "buildah"}, True, "docker"),
        ({"docker", "buildah"}, False, "buildah"),  # a docker CLI without a daemon (this machine's case)
        ({"buildah"}, True, "buildah"),
    ],
)
def test_docker_with_a_daemon_else_buildah(available, daemon_ok, chosen):
    run, which = fake_tools(available, daemon_ok=daemon_ok)
    assert images.find_builder(run, which) == chosen


def test_no_builder_says_what_to_install():
    run, which = fake_tools({"docker"}, daemon_ok=False)
    with pytest.raises(SpecError, match="install Docker with the buildx plugin.*or buildah"):
        images.find_builder(run, which)


def test_the_gpu_plan_names_base_pins_tag_and_the_exact_command(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    plan = images.plan_build("gpu", tag="gpu-test", ca_bundle=str(bundle), tool="buildah", context=tmp_path / "ctx")
    pins = images.pins(plan.root / images.DOCKERFILE)
    text = "\n".join(plan.describe())
    assert f"base     {pins['CUDA_BASE']}" in text and "cuda:13.0.3" in pins["CUDA_BASE"]
    assert "TORCH_VERSION=2.13.0" in text and f"EFA_INSTALLER_VERSION={pins['EFA_INSTALLER_VERSION']}" in text
    # the EC2 user guide's fingerprint of the key that signs the EFA installer
    assert pins["EFA_KEY_FINGERPRINT"] == "4E90 91BC BB97 A96B 26B1 5E59 A054 80B1 DD2D 3CCC"
    assert f"GPG signature, key {pins['EFA_KEY_FINGERPRINT']}" in text
    command = plan.command()
    assert command[:3] == ["buildah", "bud", "--layers"] and command[-1] == str(tmp_path / "ctx")
    assert f"{images.LOCAL_NAME}:gpu-test" in command and "FLAVOR=gpu" in command
    # the CA bundle reaches the build as a secret only, never as a build argument (those stay in the image)
    assert [arg for arg in command if str(bundle) in arg] == [f"id={images.CA_SECRET},src={bundle}"]
    assert "command  " + " ".join(command) in text


def test_without_the_layer_cache_buildah_keeps_no_step_layers_and_docker_uses_no_cache(tmp_path):
    """buildah without --layers commits each stage once: what keeps the tests' vfs storage (a whole copy of the tree
    per layer) to a few GB."""
    for tool, head in (("buildah", ["buildah", "bud", "--file"]), ("docker", ["docker", "buildx", "build", "--load"])):
        plan = images.plan_build("cpu", tag="t", tool=tool, context=tmp_path, layer_cache=False)
        command = plan.command()
        assert command[: len(head)] == head and "--layers" not in command
        assert ("--no-cache" in command) == (tool == "docker")


def test_the_cpu_plan_takes_torch_from_the_cpu_index_and_a_given_base(tmp_path):
    plan = images.plan_build("cpu", tag="t", base="localhost/debian-base", tool="docker", context=tmp_path)
    assert plan.command()[:4] == ["docker", "buildx", "build", "--load"]
    assert plan.build_args == {
        "FLAVOR": "cpu",
        "CPU_BASE": "localhost/debian-base",
        "TORCH_INDEX": images.CPU_TORCH_INDEX,
    }
    assert "EFA_INSTALLER_VERSION" not in "\n".join(plan.describe())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"flavor": "tpu"}, "--target tpu: choose one of gpu, cpu"),
        ({"tag": "-bad"}, "--tag '-bad' is not an image tag"),
        ({"tag": "x" * 129}, "is not an image tag"),
        ({"ca_bundle": "/nonexistent/ca.pem"}, "--ca-bundle /nonexistent/ca.pem: no such file"),
    ],
)
def test_bad_build_input_is_refused_before_anything_runs(kwargs, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        images.plan_build(**{"tool": "buildah", **kwargs})


class FakeEcr:
    def __init__(self, token: str):
        self.token = token

    def get_authorization_token(self):
        endpoint = "https://123456789012.dkr.ecr.us-east-1.amazonaws.com"
        return {"authorizationData": [{"authorizationToken": self.token, "proxyEndpoint": endpoint}]}


def test_the_registry_password_is_the_part_after_aws():
    token = base64.b64encode(b"AWS:s3cret:with:colons").decode()
    assert images.registry_password(FakeEcr(token)) == (
        "123456789012.dkr.ecr.us-east-1.amazonaws.com",
        "s3cret:with:colons",
    )
    with pytest.raises(SpecError, match="not AWS:<password>"):
        images.registry_password(FakeEcr(base64.b64encode(b"someone:pw").decode()))


def test_the_pushed_image_becomes_the_eks_default_only_for_its_own_repository(recorded_outputs):
    assert outputs.load_outputs().default_image == f"{ECR}:{outputs.NOT_PUSHED_TAG}"
    record = outputs.aws_state_dir() / outputs.PUSHED_IMAGE_FILE
    record.write_text(json.dumps({"image": f"{ECR}:gpu-abc", "tag": "gpu-abc", "digest": "sha256:00"}))
    assert outputs.load_outputs().default_image == f"{ECR}:gpu-abc"
    record.write_text(json.dumps({"image": "999999999999.dkr.ecr.eu-west-1.amazonaws.com/trainkit/train:gpu-abc"}))
    assert outputs.load_outputs().default_image == f"{ECR}:{outputs.NOT_PUSHED_TAG}"  # an earlier stack's record


def test_the_guard_plan_builds_its_own_stage_with_pyprojects_pins_and_no_torch(tmp_path):
    plan = images.plan_build(images.GUARD, tag="guard-t", tool="buildah", context=tmp_path)
    command = plan.command()
    assert command[command.index("--target") + 1] == "guard" and plan.build_args == {}  # no FLAVOR, no torch index
    requirements = images.guard_requirements(plan.root)
    assert [r.partition("==")[0] for r in requirements] == list(images.GUARD_PACKAGES)
    text = "\n".join(plan.describe())
    assert f"base     {images.pins(plan.root / images.DOCKERFILE)['CPU_BASE']}" in text
    assert ", ".join(requirements) in text and "TORCH" not in text
    assert images.plan_build(images.GUARD, tag="t", base="localhost/b", tool="buildah").build_args == {
        "CPU_BASE": "localhost/b"
    }
    with pytest.raises(SpecError, match="the guard image has no torch; leave --torch-index out"):
        images.plan_build(images.GUARD, tag="t", torch_index=images.CPU_TORCH_INDEX, tool="buildah")


def test_a_guard_package_pyproject_does_not_pin_exactly_is_refused(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\ndependencies = ["boto3>=1.40", "kubernetes==36.0.0"]\n')
    with pytest.raises(SpecError, match=r"pin no exact boto3 \(`boto3==<version>`\).*pin it there"):
        images.guard_requirements(tmp_path)


def test_the_guard_image_record_is_the_guards_only_and_only_for_its_own_repository(recorded_outputs):
    guard_repository = ECR.replace("/train", "/idle-guard")
    data = json.loads(outputs.outputs_path().read_text())
    data["ecr_repository_urls"][outputs.IDLE_GUARD_REPOSITORY] = guard_repository
    outputs.save_outputs(data)
    record = outputs.aws_state_dir() / outputs.IDLE_GUARD_IMAGE_FILE
    record.write_text(json.dumps({"image": f"{guard_repository}:guard-abc", "tag": "guard-abc"}))
    loaded = outputs.load_outputs()
    assert loaded.idle_guard_image == f"{guard_repository}:guard-abc"
    assert loaded.default_image == f"{ECR}:{outputs.NOT_PUSHED_TAG}"  # never the default of a training job
    record.write_text(json.dumps({"image": f"{ECR}:guard-abc"}))  # not in the guard's repository
    assert outputs.load_outputs().idle_guard_image is None


@pytest.mark.parametrize("tool", ["buildah", "docker"])
def test_images_for_the_cluster_are_built_for_its_nodes_whatever_machine_builds_them(tool, tmp_path, monkeypatch):
    """From an arm64 laptop, gpu and guard are still built for the nodes (linux/amd64: an arm64 guard fails there with
    "exec format error") and their tags say so; ECR's tags are immutable, so a tag without the architecture could
    never be corrected. The cpu flavour, built and run on this machine by the tests, stays this machine's."""
    monkeypatch.setattr(images, "machine", lambda: "arm64")
    monkeypatch.setattr(images, "content_tag", lambda root, prefix, run=None: f"{prefix}-0123456789ab")
    for flavor in ("gpu", images.GUARD):
        plan = images.plan_build(flavor, tool=tool, context=tmp_path)
        command = plan.command()
        assert command[command.index("--platform") + 1] == "linux/amd64" and command[-1] == str(tmp_path)
        assert plan.tag == f"{flavor}-amd64-0123456789ab" and "  platform linux/amd64" in plan.describe()
    cpu = images.plan_build("cpu", tool=tool, context=tmp_path)
    assert "--platform" not in cpu.command() and cpu.tag == "cpu-arm64-0123456789ab"
    assert "  platform linux/arm64 (this machine)" in cpu.describe()


def test_the_nodes_architecture_is_the_one_of_the_node_groups_ami_types():
    """outputs.NODE_ARCHITECTURE, what the cluster's images are built for, against the AMI types the Terraform modules
    give the system and GPU node groups (EKS's AMI types name x86_64 or ARM_64)."""
    modules = images.checkout() / "terraform" / "modules"
    ami_types = [
        ami
        for module in ("eks", "gpu-nodegroup")  # the system node group, the GPU node groups
        for ami in re.findall(r'^\s*ami_type\s*=\s*"([^"]+)"', (modules / module / "main.tf").read_text(), re.M)
    ]
    assert len(ami_types) == 2, ami_types
    architectures = {"amd64" if "_x86_64_" in ami else "arm64" if "_ARM_64_" in ami else ami for ami in ami_types}
    assert architectures == {outputs.NODE_ARCHITECTURE}, ami_types


def test_an_ecr_that_cannot_say_whether_the_guards_tag_is_there_spares_the_platform_stack(tmp_path, monkeypatch):
    """Throttled or refused, the tag lookup fails as a failed build does: GuardImageFailed, which `make up` answers by
    applying the platform stack all the same (trainkit/infra/lifecycle.py), never a traceback before it."""
    from botocore.exceptions import ClientError

    from trainkit.infra import guard_image

    class RefusingEcr:
        def describe_images(self, **request):
            error = {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}
            raise ClientError(error, "DescribeImages")

    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path))
    outputs.save_outputs({"ecr_repository_urls": {outputs.IDLE_GUARD_REPOSITORY: f"{ECR}/trainkit/idle-guard"}})
    monkeypatch.setattr(images, "content_tag", lambda root, prefix, run=None: f"{prefix}-0123abc")
    with pytest.raises(
        guard_image.GuardImageFailed,
        match=r"ECR did not say whether .*ThrottlingException.*neither the etcd issuer nor the idle guard runs",
    ):
        guard_image.publish_idle_guard(ecr=RefusingEcr())
