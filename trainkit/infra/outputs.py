"""What `make up PROFILE=aws` leaves for the launcher: the infra stack's outputs, the kubeconfig, the image
`invoke images.push` pushed last and the idle guard's image, under the aws profile's state folder.

`invoke infra.up --profile aws` records the infra stack's outputs in `.trainkit/aws/outputs.json`; without that
file (a dry run on a laptop) the infra stack's defaults are assumed and said so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trainkit.paths import make_folder, state_dir

STACK_TAG = "trainkit:stack-id"
"""The tag on everything a stack made, and on the jobs it runs (`infra.audit` lists what still carries it)."""
BATCH_ACTIVE = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")
"""The AWS Batch job states before a job ends (Batch User Guide, "Job states"): a STARTING or RUNNING job holds
instances that bill, a RUNNABLE one may be getting them; SUCCEEDED and FAILED jobs stay listed for days, billing
nothing. The Batch backend's "still active" and the audit's "still billing" (kept here, where both read the stack)."""
DEFAULT_INSTANCE_TYPE = "p5.48xlarge"  # the infra stack's gpu_instance_type default
NODE_ARCHITECTURE = "amd64"
"""The CPU architecture of every EKS node, as an OCI platform names it: the AMI types of the system node group
(terraform/modules/eks: AL2023_x86_64_STANDARD) and of the GPU node groups (terraform/modules/gpu-nodegroup:
AL2023_x86_64_NVIDIA; p5 and p4d are x86_64). The images the cluster runs are built for it (trainkit/infra/images.py),
whatever machine builds them; tests/unit/test_images.py holds it to those AMI types."""
IMAGE_REPOSITORY = "train"  # ECR repository key in the infra output ecr_repository_urls
NOT_PUSHED_TAG = "not-pushed"
"""The tag a job gets while `invoke images.push` has recorded no image: it exists nowhere, so the submit's image
check refuses it and says how to push one (the repositories are IMMUTABLE: there is no moving `latest`)."""
UNRECORDED_IMAGE = f"trainkit/{IMAGE_REPOSITORY}:{NOT_PUSHED_TAG}"
"""The image name a spec gets before `make up PROFILE=aws` recorded the ECR repository."""
PUSHED_IMAGE_FILE = "image.json"
"""Beside outputs.json: the image `invoke images.push` pushed last (image, tag, digest)."""
IDLE_GUARD_REPOSITORY = "idle-guard"
"""The idle guard's own ECR repository (a key of ecr_repository_urls; the infra stack makes it with the guard)."""
IDLE_GUARD_IMAGE_FILE = "idle-guard-image.json"
"""Beside outputs.json: the idle guard's image `make up PROFILE=aws` pushed last (image, tag, digest), which the
platform stack's CronJob runs."""


def aws_state_dir() -> Path:
    """Where the aws profile keeps Terraform state, the kubeconfig and the recorded outputs."""
    return state_dir() / "aws"


def outputs_path() -> Path:
    return aws_state_dir() / "outputs.json"


def kubeconfig_path() -> Path:
    """The kubeconfig `make up PROFILE=aws` writes (credentials from `aws eks get-token`)."""
    return aws_state_dir() / "kubeconfig"


def save_outputs(outputs: dict) -> Path:
    path = outputs_path()
    make_folder(path.parent)
    path.write_text(json.dumps(outputs, indent=2, sort_keys=True) + "\n")
    return path


@dataclass(frozen=True)
class InfraOutputs:
    """The infra outputs the EKS backend uses; `recorded` says whether they came from a real `make up`."""

    instance_type: str
    image_repository: str | None
    region: str | None
    recorded: bool
    fsx_capacity_gib: int | None = None
    fsx_throughput_per_tib: int | None = None  # MB/s per TiB of the FSx file system (PERSISTENT_2)
    fsx_file_system_id: str | None = None  # None in a recorded stack: enable_fsx = false
    pushed_image: str | None = None
    data_buckets: tuple[str, ...] = ()  # what the data-preparation job may read (data_source_buckets)
    fsx_zone: str | None = None  # the GPU nodes' and FSx's availability zone
    sagemaker: dict | None = None  # the infra stack's `sagemaker` output (trainkit/backends/sagemaker/stack.py)
    batch: dict | None = None  # the infra stack's `batch` output (terraform/modules/batch/README.md)
    stack_id: str | None = None  # the value of STACK_TAG on everything the stack made (the audit's key)
    idle_guard: dict | None = None  # the infra stack's `idle_guard` output (trainkit/backends/eks/idle_guard.py)
    gpu_nodegroup: dict | None = None  # the infra stack's `gpu_nodegroup` output: cluster_name, region, nodegroup
    idle_guard_repository: str | None = None  # its own ECR repository (IDLE_GUARD_REPOSITORY)
    idle_guard_image: str | None = None  # the guard's image pushed there last (IDLE_GUARD_IMAGE_FILE)
    mlflow: dict | None = (
        None  # the infra stack's `mlflow` output: its managed tracking server (terraform/modules/mlflow)
    )

    @property
    def default_image(self) -> str:
        """The EKS default: the image pushed last to this stack's repository, else a tag that says none was."""
        if self.pushed_image:
            return self.pushed_image
        return f"{self.image_repository}:{NOT_PUSHED_TAG}" if self.image_repository else UNRECORDED_IMAGE


def load_outputs() -> InfraOutputs:
    path = outputs_path()
    if not path.is_file():
        return InfraOutputs(DEFAULT_INSTANCE_TYPE, None, None, recorded=False)
    data = json.loads(path.read_text())
    repositories = data.get("ecr_repository_urls") or {}
    repository, guard_repository = repositories.get(IMAGE_REPOSITORY), repositories.get(IDLE_GUARD_REPOSITORY)
    return InfraOutputs(
        instance_type=data.get("gpu_instance_type") or DEFAULT_INSTANCE_TYPE,
        image_repository=repository,
        region=data.get("region"),
        recorded=True,
        fsx_capacity_gib=data.get("fsx_storage_capacity_gib"),
        fsx_throughput_per_tib=data.get("fsx_throughput_per_tib"),
        fsx_file_system_id=data.get("fsx_file_system_id"),
        data_buckets=tuple((data.get("data_reader") or {}).get("buckets") or ()),
        fsx_zone=data.get("gpu_availability_zone"),
        sagemaker=data.get("sagemaker"),
        batch=data.get("batch"),
        stack_id=data.get("stack_id"),
        idle_guard=data.get("idle_guard"),
        gpu_nodegroup=data.get("gpu_nodegroup") or data.get("idle_guard"),  # outputs from before the first had both
        pushed_image=_pushed(PUSHED_IMAGE_FILE, repository),
        idle_guard_repository=guard_repository,
        idle_guard_image=_pushed(IDLE_GUARD_IMAGE_FILE, guard_repository),
        mlflow=data.get("mlflow"),
    )


def _pushed(record: str, repository: str | None) -> str | None:
    """The image a push recorded in `record`, when it is in `repository`: a record from an earlier stack's
    repository is not this stack's image."""
    path = aws_state_dir() / record
    pushed = json.loads(path.read_text())["image"] if path.is_file() else None
    return pushed if repository and pushed and pushed.startswith(f"{repository}:") else None
