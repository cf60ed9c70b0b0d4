"""Checks before a job is submitted to EKS. Each failure is one sentence that says what to run.

Order: the cheapest and most fundamental first (is there a cluster at all), so the first message
is the one to act on.
"""

from __future__ import annotations

from training.common.job import Job
from trainkit import hardware
from trainkit.backends.eks import cluster
from trainkit.backends.eks.image import check_image
from trainkit.backends.eks.kube import GROUP, PLURAL, TIMEOUT_S, VERSION, Kube, api_errors, unless_missing
from trainkit.backends.eks.render import job_name
from trainkit.errors import SpecError
from trainkit.infra import outputs
from trainkit.job.models import get_model
from trainkit.run.storage import check_fsx_capacity


def check_cluster(kube: Kube) -> None:
    api_error, connection_error = api_errors()
    try:
        kube.version.get_code(_request_timeout=TIMEOUT_S)
    except (api_error, connection_error) as error:
        reason = f"HTTP {error.status}" if isinstance(error, api_error) else type(error).__name__
        raise SpecError(
            f"cannot reach the Kubernetes API at {kube.host} ({reason}): run `make up PROFILE=aws` if the cluster "
            "is not up, or refresh your AWS credentials"
        ) from None


def check_operator(kube: Kube) -> None:
    resources = unless_missing(kube.custom.get_api_resources, GROUP, VERSION)
    if resources is None or not any(r.name == PLURAL for r in resources.resources):
        raise SpecError(
            "the cluster has no PyTorchJob kind (kubeflow.org/v1): run `make up PROFILE=aws`, whose platform stack "
            "installs the training operator"
        )


def check_capacity(kube: Kube, job: Job, waking: bool = False) -> str | None:
    """Enough nodes of the instance type with the GPUs and EFA devices one worker asks for. `waking`: the node
    group was just asked for its nodes back (idle_guard.wake), so too few now is no error: the job waits."""
    instance = hardware.INSTANCE_TYPES[job.placement.instance_type]
    nodes = kube.core.list_node(
        label_selector=f"node.kubernetes.io/instance-type={job.placement.instance_type}", _request_timeout=TIMEOUT_S
    ).items
    efa = instance.efa_interfaces

    def fits(node) -> bool:
        free = node.status.allocatable or {}
        return (
            int(free.get("nvidia.com/gpu", 0)) >= job.parallelism.nproc
            and int(free.get("vpc.amazonaws.com/efa", 0)) >= efa
        )

    usable = sum(1 for node in nodes if fits(node) and not node.spec.unschedulable)
    need = f"{job.parallelism.nproc} GPUs" + (f" and {efa} EFA devices" if efa else "")
    if usable < job.parallelism.min_nodes and not waking:
        raise SpecError(
            f"the job needs {job.parallelism.min_nodes} {job.placement.instance_type} node(s) with {need} allocatable "
            "each and the "
            f"cluster has {usable}: raise gpu_desired_nodes in terraform/stacks/infra/terraform.tfvars and run "
            f"`make up PROFILE=aws`, or ask for fewer with --nodes {max(usable, 1)}"
        )
    if usable < job.parallelism.nodes:
        return (
            f"{usable} of {job.parallelism.nodes} nodes are ready; the job starts at {usable} and grows when more join"
        )
    return None


def check_volume(kube: Kube, namespace: str) -> None:
    claim = unless_missing(kube.core.read_namespaced_persistent_volume_claim, cluster.FSX_CLAIM, namespace)
    phase = claim.status.phase if claim else "missing"
    if phase != "Bound":
        raise SpecError(
            f"the FSx volume claim {namespace}/{cluster.FSX_CLAIM} is {phase}, not Bound: run `make up PROFILE=aws` "
            "(the platform stack creates it from the infra stack's FSx file system)"
        )


def check_secret(kube: Kube, job: Job) -> None:
    if job.model.init != "pretrained":
        return
    if unless_missing(kube.core.read_namespaced_secret, cluster.HF_TOKEN_SECRET, job.placement.namespace) is None:
        raise SpecError(
            f"--init pretrained downloads {job.model.weights} with your Hugging Face token, and the cluster has no "
            "Secret "
            f"{job.placement.namespace}/{cluster.HF_TOKEN_SECRET}: run `invoke secrets.hf-token` first"
        )


def check_storage(job: Job) -> None:
    """What the run writes (checkpoints, export) must fit on the FSx file system `make up` recorded."""
    capacity = outputs.load_outputs().fsx_capacity_gib
    if capacity:
        check_fsx_capacity(job, get_model(job.model.name), int(capacity))


def check_not_running(kube: Kube, job: Job) -> None:
    name = job_name(job.run.run_id)
    if (
        unless_missing(kube.custom.get_namespaced_custom_object, GROUP, VERSION, job.placement.namespace, PLURAL, name)
        is None
    ):
        return
    raise SpecError(
        f"run {job.run.run_id} already has a job on the cluster ({job.placement.namespace}/{name}): follow it with "
        f"`invoke status --run-id {job.run.run_id}`, or `invoke stop --run-id {job.run.run_id}` and submit again "
        "to resume"
    )


def preflight(kube: Kube, job: Job, ecr=None, training: bool = True, waking: bool = False) -> list[str]:
    """Every check, in order; returns notes (things that are fine but worth saying). `training` False (another
    workload on the job's placement, e.g. the NCCL test): the model's storage and token are not its concern."""
    check_cluster(kube)
    check_operator(kube)
    check_not_running(kube, job)
    notes = [check_capacity(kube, job, waking)]
    check_volume(kube, job.placement.namespace)
    if training:
        check_storage(job)
        check_secret(kube, job)
    notes.append(check_image(job, ecr, tag_run=training))
    return [note for note in notes if note]
