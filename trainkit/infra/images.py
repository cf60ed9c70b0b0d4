"""The training image (containers/train/Dockerfile): build it with docker buildx or buildah, push it to the infra
stack's ECR repository, and record what was pushed as the EKS backend's default image. The same file's stage
`guard` is the EKS idle guard's small image, which `make up PROFILE=aws` builds and pushes to a repository of its own
(trainkit/infra/guard_image.py) for the platform stack's CronJob.

Tags are content-addressed: `<flavor>-<arch>-<commit>`, and `-dirty-<hash>` after it for a checkout with changes (a hash
of the diff and the untracked files: two different dirty trees never share a tag); `<arch>` is what the image is built
for (`architecture`: the EKS nodes' for gpu and guard). The ECR repositories are IMMUTABLE (terraform/modules/ecr): a
tag names one image for good, so a run's spec.json says what it ran, and pushing a tag already there is a no-op.

ECR login: boto3's `get_authorization_token` gives a base64 `AWS:<password>`; the password goes to
`<tool> login --password-stdin` on standard input, never on a command line or in a log.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from platform import machine

from trainkit.errors import SpecError
from trainkit.infra import outputs
from trainkit.paths import make_folder

GUARD = "guard"
"""The idle guard's image (trainkit/backends/eks/idle_guard.py): the Dockerfile's stage of that name."""
FLAVORS = ("gpu", "cpu", GUARD)
GUARD_PACKAGES = ("boto3", "kubernetes", "PyYAML", "prometheus-client", "python-dateutil", "cryptography")
"""What the guard's image installs beside trainkit's own code (which comes without its dependencies), at
pyproject.toml's pins: what the guard imports (tests/integration/test_idle_guard_image.py holds that it loads none of
trainkit's other dependencies, torch included)."""
GUARD_REQUIREMENTS = "guard-requirements.txt"  # written into the context's dist/ for the guard's build
LOCAL_NAME = "localhost/trainkit-train"
DOCKERFILE = Path("containers") / "train" / "Dockerfile"
SIGNATURE_CHECK = Path("containers") / "train" / "verify-signature.sh"
TORCH_LOCK = Path("containers") / "train" / "torch-gpu.txt"  # the gpu flavour's torch, hash-pinned
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
CA_SECRET = "pip-ca"
BUILDS_FILE = "images.json"  # what images.build made, per flavour, beside the infra outputs

Runner = Callable[..., subprocess.CompletedProcess]


def architecture(flavor: str) -> str:
    """What an image is built for: the EKS nodes' architecture (gpu, guard), else this machine's (cpu: the tests')."""
    here = machine().lower()
    return outputs.NODE_ARCHITECTURE if flavor != "cpu" else {"x86_64": "amd64", "aarch64": "arm64"}.get(here, here)


def checkout() -> Path:
    """The source tree the image is built from: this package's checkout (an installed wheel has none)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / DOCKERFILE).is_file() or not (root / "pyproject.toml").is_file():
        raise SpecError(
            f"images are built from a checkout of trainkit (no {DOCKERFILE} beside this installed package): "
            "clone the repository and run `invoke images.build` there"
        )
    return root


def pins(dockerfile: Path) -> dict[str, str]:
    """The Dockerfile's ARG defaults (bases and versions), as written."""
    found = re.findall(r'^ARG ([A-Z_]+)=("[^"]*"|\S*)$', dockerfile.read_text(), flags=re.MULTILINE)
    return {name: value.strip('"') for name, value in found}


def content_tag(root: Path, prefix: str, run: Runner = subprocess.run) -> str:
    def git(*args: str) -> str:
        done = run(["git", "-C", str(root), *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise SpecError(f"--tag is needed outside a git checkout (git {args[0]}: {done.stderr.strip()})")
        return done.stdout

    commit = git("rev-parse", "HEAD").strip()[:12]
    status = git("status", "--porcelain", "--untracked-files=all")
    if not status.strip():
        return f"{prefix}-{commit}"
    digest = hashlib.sha256(git("diff", "HEAD", "--binary").encode())
    for line in sorted(status.splitlines()):
        if line.startswith("??"):
            path = root / line[3:]
            digest.update(line.encode() + (path.read_bytes() if path.is_file() else b""))
    return f"{prefix}-{commit}-dirty-{digest.hexdigest()[:8]}"


def find_builder(run: Runner = subprocess.run, which: Callable[[str], str | None] = shutil.which) -> str:
    """docker (with buildx, and a daemon that answers) where there is one, else buildah (no daemon needed)."""
    if which("docker"):
        buildx = run(["docker", "buildx", "version"], capture_output=True, text=True)
        daemon = run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
        if buildx.returncode == 0 and daemon.returncode == 0:
            return "docker"
    if which("buildah"):
        return "buildah"
    raise SpecError(
        "no image builder: install Docker with the buildx plugin (and start its daemon), or buildah, which needs "
        "no daemon (Debian/Ubuntu: apt-get install buildah; as root inside a container set BUILDAH_ISOLATION=chroot, "
        'and where overlay mounts are refused point CONTAINERS_STORAGE_CONF at a storage.conf with driver "vfs")'
    )


@dataclass
class BuildPlan:
    tool: str
    flavor: str
    tag: str
    root: Path
    context: Path
    build_args: dict[str, str] = field(default_factory=dict)
    ca_bundle: Path | None = None
    layer_cache: bool = True
    platform: str | None = None  # `--platform` (docker-buildx-build(1), buildah-build(1)); None: the builder's own

    @property
    def image(self) -> str:
        return f"{LOCAL_NAME}:{self.tag}"

    @property
    def stage(self) -> str:
        """The Dockerfile stage built: `app` for both training flavours (FLAVOR picks its base), else `guard`."""
        return GUARD if self.flavor == GUARD else "app"

    def command(self) -> list[str]:
        # Without the layer cache: docker ignores its build cache; buildah keeps no per-step layers and commits each
        # stage once (buildah-build(1), --layers), which under its vfs driver (a whole copy of the tree per layer)
        # needs a fraction of the disk.
        if self.tool == "docker":
            head = ["docker", "buildx", "build", "--load", *([] if self.layer_cache else ["--no-cache"])]
        else:
            head = ["buildah", "bud", *(["--layers"] if self.layer_cache else [])]
        command = [*head, "--file", str(self.root / DOCKERFILE), "--target", self.stage, "--tag", self.image]
        command += ["--platform", self.platform] if self.platform else []
        for name, value in sorted(self.build_args.items()):
            command += ["--build-arg", f"{name}={value}"]
        if self.ca_bundle:
            command += ["--secret", f"id={CA_SECRET},src={self.ca_bundle}"]
        return [*command, str(self.context)]

    def describe(self) -> list[str]:
        defaults = pins(self.root / DOCKERFILE)
        chosen = {**defaults, **self.build_args}
        base = chosen["CUDA_BASE"] if self.flavor == "gpu" else chosen["CPU_BASE"]
        lines = [f"image {self.image} ({self.flavor}), built with {self.tool}", f"  base     {base}"]
        lines.append(f"  platform {self.platform or 'linux/' + architecture(self.flavor) + ' (this machine)'}")
        if self.flavor == GUARD:
            lines.append("  pins     " + ", ".join(guard_requirements(self.root)) + " (pyproject.toml's)")
        else:
            versions = ["TORCH_VERSION", "TORCHVISION_VERSION"]
            versions += ["EFA_INSTALLER_VERSION"] if self.flavor == "gpu" else []
            lines.append("  pins     " + ", ".join(f"{name}={chosen[name]}" for name in versions))
        if self.flavor == "gpu":
            lines.append(f"  verify   the EFA installer's GPG signature, key {chosen['EFA_KEY_FINGERPRINT']}")
        if chosen.get("TORCH_INDEX"):
            lines.append(f"  torch    from {chosen['TORCH_INDEX']} (and PyPI)")
        elif self.flavor == "gpu":
            lines.append(f"  torch    {TORCH_LOCK}'s wheels only, hash-checked (pip --require-hashes)")
        lines.append(f"  context  {self.context} (dist/: the trainkit wheel of this checkout; wheels/: local wheels)")
        if self.ca_bundle:
            lines.append(f"  secret   {CA_SECRET} <- {self.ca_bundle} (pip's CA bundle; not kept in any layer)")
        lines.append("  command  " + " ".join(self.command()))
        return lines


def plan_build(
    flavor: str = "gpu",
    tag: str | None = None,
    base: str | None = None,
    ca_bundle: str | None = None,
    torch_index: str | None = None,
    tool: str | None = None,
    context: Path | None = None,
    layer_cache: bool = True,
) -> BuildPlan:
    """Everything about a build, decided and checked before anything is built."""
    if flavor not in FLAVORS:
        raise SpecError(f"--target {flavor}: choose one of {', '.join(FLAVORS)}")
    if tag is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        raise SpecError(f"--tag {tag!r} is not an image tag: letters, digits, _ . - (at most 128, not starting . -)")
    bundle = Path(ca_bundle).expanduser().absolute() if ca_bundle else None
    if bundle is not None and not bundle.is_file():
        raise SpecError(f"--ca-bundle {ca_bundle}: no such file")
    if flavor == GUARD and torch_index:
        raise SpecError(f"--torch-index {torch_index}: the {GUARD} image has no torch; leave --torch-index out")
    root = checkout()
    build_args = {} if flavor == GUARD else {"FLAVOR": flavor}
    if base:
        build_args["CUDA_BASE" if flavor == "gpu" else "CPU_BASE"] = base
    index = torch_index if torch_index is not None else (CPU_TORCH_INDEX if flavor == "cpu" else "")
    if index:
        build_args["TORCH_INDEX"] = index
    return BuildPlan(
        tool=tool or find_builder(),
        flavor=flavor,
        tag=tag or content_tag(root, f"{flavor}-{architecture(flavor)}"),
        root=root,
        context=context or outputs.aws_state_dir().parent / f"image-context-{flavor}",
        build_args=build_args,
        ca_bundle=bundle,
        layer_cache=layer_cache,
        platform=None if flavor == "cpu" else f"linux/{architecture(flavor)}",
    )


def guard_requirements(root: Path) -> list[str]:
    """GUARD_PACKAGES as pyproject.toml pins them (`name==version`), so the guard's versions are written once."""
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]

    def canonical(name: str) -> str:  # PEP 503's normalised project name
        return re.sub(r"[-_.]+", "-", name).lower()

    pins = {canonical(re.match(r"[A-Za-z0-9._-]+", spec)[0]): spec.strip() for spec in declared}
    found = [pins.get(canonical(name), "") for name in GUARD_PACKAGES]
    for name, spec in zip(GUARD_PACKAGES, found, strict=True):
        if not re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.!+]+", spec):
            raise SpecError(
                f"pyproject.toml's dependencies pin no exact {name} (`{name}==<version>`), which the idle guard's "
                f"image installs (GUARD_PACKAGES in trainkit/infra/images.py): pin it there"
            )
    return found


def stage_context(plan: BuildPlan, wheels: str | None = None, run: Runner = subprocess.run) -> None:
    """The build context: dist/ holds the trainkit wheel of the checkout (and, for the guard, its requirements);
    wheels/ the local wheels asked for; verify-signature.sh the gpu flavour's check of the EFA installer's signature,
    torch-gpu.txt its hash-pinned torch.

    The wheel is built from a copy of the files git sees (tracked, and untracked but not ignored: what the tag
    hashes), so nothing stale in the checkout (build/, an old egg-info) reaches the image."""
    shutil.rmtree(plan.context, ignore_errors=True)
    make_folder(plan.context / "wheels")
    listed = run(["git", "-C", str(plan.root), "ls-files", "-z", "-co", "--exclude-standard"], capture_output=True)
    if listed.returncode != 0:
        raise SpecError("images are built from a git checkout (git ls-files failed)")
    with tempfile.TemporaryDirectory(prefix="trainkit-src-") as folder:
        source = Path(folder)
        for name in filter(None, listed.stdout.decode().split("\0")):
            if (plan.root / name).is_file():
                (source / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(plan.root / name, source / name)
        command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        done = run([*command, "--wheel-dir", str(plan.context / "dist"), str(source)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SpecError(f"building the trainkit wheel failed: {done.stderr.strip()[-2000:]}")
    if plan.flavor == GUARD:
        (plan.context / "dist" / GUARD_REQUIREMENTS).write_text("\n".join(guard_requirements(plan.root)) + "\n")
    for wheel in sorted(Path(wheels).glob("*.whl")) if wheels else []:
        shutil.copy(wheel, plan.context / "wheels" / wheel.name)
    for part in (SIGNATURE_CHECK, TORCH_LOCK):
        shutil.copy2(plan.root / part, plan.context / part.name)


def record(name: str, flavor_or_none: str | None, entry: dict) -> None:
    path = outputs.aws_state_dir() / name
    data = json.loads(path.read_text()) if path.is_file() else {}
    data = {**data, flavor_or_none: entry} if flavor_or_none else entry
    make_folder(path.parent)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def build(plan: BuildPlan, wheels: str | None = None, run: Runner = subprocess.run) -> str:
    stage_context(plan, wheels, run)
    done = run(plan.command())
    if done.returncode != 0:
        raise SpecError(f"the image build failed (exit {done.returncode}); the builder's output is above")
    record(BUILDS_FILE, plan.flavor, {"image": plan.image, "tag": plan.tag})
    return plan.image


def last_built(flavor: str) -> str:
    path = outputs.aws_state_dir() / BUILDS_FILE
    built = json.loads(path.read_text()).get(flavor) if path.is_file() else None
    if not built:
        raise SpecError(f"no {flavor} image built yet: run `invoke images.build --target {flavor}` first")
    return built["tag"]


def registry_password(ecr) -> tuple[str, str]:
    """(registry host, password) from ECR's authorization token."""
    data = ecr.get_authorization_token()["authorizationData"][0]
    user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    if user != "AWS" or not password:
        raise SpecError("ECR returned an authorization token that is not AWS:<password>")
    return data["proxyEndpoint"].removeprefix("https://").rstrip("/"), password


def push(tag: str, tool: str, ecr=None, run: Runner = subprocess.run, flavor: str = "gpu") -> dict:
    """Log in to ECR (password on stdin), push `LOCAL_NAME:tag` to the train repository (the guard's image: to its
    own), record it."""
    infra = outputs.load_outputs()
    repository = infra.idle_guard_repository if flavor == GUARD else infra.image_repository
    if not repository and flavor == GUARD:
        raise SpecError(
            "no idle-guard ECR repository recorded: set idle_guard_minutes in terraform/stacks/infra/terraform.tfvars "
            "and run `make up PROFILE=aws` (it makes the repository and pushes the guard's image itself)"
        )
    if not repository:
        raise SpecError("no ECR repository recorded: run `make up PROFILE=aws` first (it records the repository)")
    if ecr is None:
        import boto3

        ecr = boto3.client("ecr", region_name=infra.region)
    remote = f"{repository}:{tag}"
    registry, password = registry_password(ecr)
    login = run([tool, "login", "--username", "AWS", "--password-stdin", registry], input=password, text=True)
    if login.returncode != 0:
        raise SpecError(f"{tool} login to {registry} failed (exit {login.returncode})")
    existing = digest_of(ecr, repository.split("/", 1)[1], tag)
    if existing:
        digest, note = existing, "already in ECR (tags are immutable there): not pushed again"
    else:
        digest, note = _push(tool, f"{LOCAL_NAME}:{tag}", remote, run), "pushed"
    entry = {"image": remote, "tag": tag, "digest": digest}
    record(outputs.IDLE_GUARD_IMAGE_FILE if flavor == GUARD else outputs.PUSHED_IMAGE_FILE, None, entry)
    return {**entry, "note": note}


def digest_of(ecr, repository: str, tag: str) -> str | None:
    """The digest `tag` names in the repository, None when no image has it (asked by tag: no listing to page)."""
    from botocore.exceptions import ClientError

    try:
        (image,) = ecr.describe_images(repositoryName=repository, imageIds=[{"imageTag": tag}])["imageDetails"]
    except ClientError as error:
        if error.response["Error"]["Code"] == "ImageNotFoundException":
            return None
        raise
    return image["imageDigest"]


def _push(tool: str, local: str, remote: str, run: Runner) -> str:
    with tempfile.TemporaryDirectory() as folder:
        if tool == "buildah":
            digest_file = Path(folder) / "digest"
            done = run(["buildah", "push", "--digestfile", str(digest_file), local, f"docker://{remote}"])
            digest = digest_file.read_text().strip() if done.returncode == 0 else ""
        else:
            done = run(["docker", "tag", local, remote])
            if done.returncode == 0:
                done = run(["docker", "push", remote])
            inspect = ["docker", "inspect", "--format", "{{index .RepoDigests 0}}", remote]
            found = run(inspect, capture_output=True, text=True)
            digest = found.stdout.strip().rpartition("@")[2]
    if done.returncode != 0 or not digest:
        raise SpecError(f"pushing {remote} failed (exit {done.returncode}); the builder's output is above")
    return digest
