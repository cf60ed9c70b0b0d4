"""Checks before a job is submitted to EKS. Each failure is one sentence that says what to run.

Order: the cheapest and most fundamental first (is there a cluster at all), so the first message
is the one to act on.
"""

from __future__ import annotations

from training.spec import Job
from trainkit import hardware
from trainkit.backends.eks import cluster
from trainkit.backends.eks.image import check_image
from trainkit.backends.eks.kube import GROUP, PLURAL, TIMEOUT_S, VERSION, Kube, api_errors, unless_missing
from trainkit.backends.eks.render import job_name, signs_requests
from trainkit.errors import SpecError
from trainkit.infra import outputs
from trainkit.job.models import downloads_weights, get_model
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


GPU_NODEGROUP = "gpu"
"""The GPU node group's name: its key in the infra stack's node_groups (terraform/stacks/infra/main.tf)."""


def check_capacity(kube: Kube, job: Job, planned: int | None = None) -> str | None:
    """Enough schedulable nodes of the instance type whose allocatable GPUs and EFA devices (what the node offers
    pods in all, node.status.allocatable) cover one worker. Allocatable, not free: a node another job's pods hold
    counts, since this job then waits for it (Pending) rather than being refused; whether the nodes are free shows
    once the job is created (`invoke status`). `planned`: `make up` recorded the GPU node group and the launcher asks it
    for this many nodes of the job's type before it creates the job (nodegroup.plan_wake checked the type and
    maxSize), so too few now is no error: the job waits for them."""
    instance = hardware.INSTANCE_TYPES[job.placement.instance_type]
    nodes = kube.core.list_node(
        label_selector=f"node.kubernetes.io/instance-type={job.placement.instance_type}", _request_timeout=TIMEOUT_S
    ).items
    efa = instance.efa_interfaces

    def fits(node) -> bool:
        allocatable = node.status.allocatable or {}
        return (
            int(allocatable.get("nvidia.com/gpu", 0)) >= job.parallelism.nproc
            and int(allocatable.get("vpc.amazonaws.com/efa", 0)) >= efa
        )

    usable = sum(1 for node in nodes if fits(node) and not node.spec.unschedulable)
    p = job.parallelism
    if usable < p.min_nodes and planned is not None:
        return (
            f"{usable} of the {p.min_nodes} {job.placement.instance_type} node(s) the job needs are in the cluster "
            f"now; it stays Pending until the node group's nodes (it asks for {planned}) join and are free"
        )
    if usable < p.min_nodes:
        raise SpecError(capacity_refusal(job, usable, efa))
    if usable < p.nodes:
        return (
            f"{usable} of {p.nodes} nodes are in the cluster; the job starts with at most {usable} and grows when more "
            "join"
        )
    return None


def capacity_refusal(job: Job, usable: int, efa: int) -> str:
    """What to change when the cluster has too few nodes for the job and no `make up` recorded the GPU node group the
    launcher would ask for them (outputs.json: this machine did not run it). Terraform sets the
    node group's desired size only when it creates the group (lifecycle ignore_changes in terraform/modules/
    gpu-nodegroup), so gpu_desired_nodes and `make up` cannot add nodes to a running cluster: the group is scaled
    directly, within its maxSize (gpu_max_nodes)."""
    infra = outputs.load_outputs()
    wanted, p = job.placement.instance_type, job.parallelism
    if infra.recorded and wanted != infra.instance_type:
        return (
            f"the job asks for {wanted} nodes and the GPU node group has {infra.instance_type}: leave --instance-type "
            f'out, or set gpu_instance_type = "{wanted}" in terraform/stacks/infra/terraform.tfvars and run '
            "`make up PROFILE=aws`"
        )
    need = f"{p.nproc} GPUs" + (f" and {efa} EFA devices" if efa else "")
    return (
        f"the job needs {p.min_nodes} {wanted} node(s) with {need} allocatable each and the cluster has {usable}, and "
        "no `make up PROFILE=aws` on this machine recorded the GPU node group to ask for them: submit from the machine "
        f"that ran it (or copy its outputs.json here, to {outputs.outputs_path()}), ask for fewer "
        f"with --nodes {max(usable, 1)}, or scale the group yourself (Terraform sets its desired size only when it "
        f"creates it): `aws eks update-nodegroup-config --cluster-name <cluster_name> "
        f"--nodegroup-name {GPU_NODEGROUP} --scaling-config desiredSize={p.min_nodes}` (cluster_name as `make up` "
        "printed it), at most gpu_max_nodes (terraform/stacks/infra/terraform.tfvars)"
    )


def check_volume(kube: Kube, namespace: str) -> None:
    claim = unless_missing(kube.core.read_namespaced_persistent_volume_claim, cluster.FSX_CLAIM, namespace)
    phase = claim.status.phase if claim else "missing"
    if phase != "Bound":
        raise SpecError(
            f"the FSx volume claim {namespace}/{cluster.FSX_CLAIM} is {phase}, not Bound: run `make up PROFILE=aws` "
            "(the platform stack creates it from the infra stack's FSx file system)"
        )
    # The pods run as the jobs' user, and FSx squashes root: only the platform's layout step makes the root theirs.
    layout = unless_missing(kube.batch.read_namespaced_job, cluster.FSX_LAYOUT, cluster.PLATFORM_NAMESPACE)
    conditions = {c.type: c.status for c in (layout.status.conditions or [])} if layout else {}
    if conditions.get("Complete") != "True":
        state = "never ran" if layout is None else "failed" if conditions.get("Failed") == "True" else "not finished"
        raise SpecError(
            f"the platform's FSx layout step ({cluster.PLATFORM_NAMESPACE}/{cluster.FSX_LAYOUT}) {state}, so the "
            f"FSx root is not the jobs' user's ({cluster.JOB_UID}) and their pods could not write there: see "
            f"`kubectl -n {cluster.PLATFORM_NAMESPACE} logs job/{cluster.FSX_LAYOUT}`, then run `make up PROFILE=aws` "
            "(it runs in the platform's image, which make up builds and pushes: from a checkout with Docker or buildah)"
        )


def check_secret(kube: Kube, job: Job) -> None:
    if not downloads_weights(job):  # a model folder on the volume needs no token
        return
    if unless_missing(kube.core.read_namespaced_secret, cluster.HF_TOKEN_SECRET, job.placement.namespace) is None:
        raise SpecError(
            f"--init pretrained downloads {job.model.weights} with your Hugging Face token, and the cluster has no "
            "Secret "
            f"{job.placement.namespace}/{cluster.HF_TOKEN_SECRET}: run `invoke secrets.hf-token` first"
        )


def check_training_identity(kube: Kube, job: Job) -> None:
    """A job that logs to a SageMaker managed MLflow tracking server runs as the training service account, whose AWS
    credentials sign its requests: without it the pods are never created."""
    if not signs_requests(job):
        return
    account = cluster.TRAINING_SERVICE_ACCOUNT
    if unless_missing(kube.core.read_namespaced_service_account, account, job.placement.namespace) is None:
        raise SpecError(
            f"--tracking-uri {job.tracking.uri}: the pods sign their MLflow requests as the service account "
            f"{job.placement.namespace}/{account}, which the cluster does not have: set mlflow_enabled = true and run "
            "`make up PROFILE=aws` (the platform stack creates it, the infra stack gives it its AWS role)"
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


ISSUER_STALE_S = 600  # the issuer writes its status each minute: ten without one and its pods may wait


def check_etcd_issuer(kube: Kube, job: Job, now: float | None = None) -> str | None:
    """An etcd job on the platform's etcd needs its identity from the platform's issuer (trainkit/backends/eks/
    etcd_issuer.py), without which its pods wait for their Secret: refused when the issuer never ran, a note when
    its last pass is old."""
    import datetime
    import time

    from trainkit.backends.eks.etcd_issuer import STATUS_PASSED
    from trainkit.backends.eks.render import rdzv_endpoint

    if job.elastic.rdzv != "etcd" or rdzv_endpoint(job) != cluster.etcd_endpoint():
        return None
    namespace = job.placement.namespace
    status = unless_missing(kube.core.read_namespaced_config_map, cluster.ETCD_ISSUER, namespace)
    if status is None:
        raise SpecError(
            f"the platform's etcd issuer has never run (no ConfigMap {namespace}/{cluster.ETCD_ISSUER}), so an etcd "
            "job's pods would get no etcd identity and wait: it runs in the platform's image, which `make up "
            "PROFILE=aws` builds and pushes (run it again from a checkout with Docker or buildah), or use --rdzv c10d"
        )
    passed = datetime.datetime.fromisoformat((status.data or {}).get(STATUS_PASSED, "1970-01-01T00:00:00+00:00"))
    age = (now or time.time()) - passed.timestamp()
    if age > ISSUER_STALE_S:
        return (
            f"the platform's etcd issuer last ran {age / 60:.0f} minutes ago: this job's pods wait for their etcd "
            f"identity until it runs again (kubectl -n {cluster.PLATFORM_NAMESPACE} logs deploy/{cluster.ETCD_ISSUER})"
        )
    return None


def preflight(kube: Kube, job: Job, ecr=None, training: bool = True, planned: int | None = None) -> list[str]:
    """Every check, in order; returns notes (things that are fine but worth saying). `training` False (another
    workload on the job's placement, e.g. the NCCL test): the model's storage and token are not its concern.
    `planned`: the GPU nodes the launcher asks the GPU node group for once these checks pass."""
    check_cluster(kube)
    check_operator(kube)
    check_not_running(kube, job)
    notes = [check_capacity(kube, job, planned)]
    check_volume(kube, job.placement.namespace)
    notes.append(check_etcd_issuer(kube, job))
    check_training_identity(kube, job)
    if training:
        check_storage(job)
        check_secret(kube, job)
    notes.append(check_image(job, ecr, tag_run=training))
    return [note for note in notes if note]
