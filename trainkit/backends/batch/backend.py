"""AWS Batch backend: the job as a multi-node parallel (MNP) Batch job, through boto3.

`resolve` takes the instance type (--instance-type, else the stack's first, else the infra stack's GPU type), one
process per GPU, the run folder under the FSx mount every node shares (`runs/<run-id>` from the containers' working
directory, as on EKS), and a c10d rendezvous on the main node (an MNP job runs a fixed set of nodes and no etcd).
`check` refuses what Batch cannot do (an elastic range, an etcd rendezvous, a namespace, a path off FSx, a timeout
under Batch's 60 s). `--dry-run` prints the RegisterJobDefinition and SubmitJob requests and contacts nothing.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from training.spec import EXPORT_DIR, SYNTHETIC, Job
from trainkit import hardware
from trainkit.backends.aws import AwsBackend, Clients, secret_state, stamp
from trainkit.backends.base import cloud_machine
from trainkit.backends.batch import api, jobs, request
from trainkit.backends.batch.stack import NOT_RECORDED, BatchStack, load_stack
from trainkit.errors import SpecError
from trainkit.infra import outputs
from trainkit.job.build import Machine
from trainkit.job.tracking import stack_tracking
from trainkit.run.secrets import job_credentials
from trainkit.run.state import RunStatus
from trainkit.run.storage import fsx_mb_s
from trainkit.run.workload import Workload


def resolve(job: Job) -> Machine:
    infra = outputs.load_outputs()
    stack = load_stack(infra)
    placement, elastic = job.placement, job.elastic
    if placement.instance_type is None:
        placement.instance_type = stack.instance_types[0] if stack.instance_types else infra.instance_type
    machine = cloud_machine(job, infra.default_image)
    stack_tracking(job, infra)
    if elastic.rdzv not in (None, "c10d") or elastic.rdzv_endpoint:
        raise SpecError(
            "--rdzv/--rdzv-endpoint: a Batch job meets on its main node (c10d); drop them for --target batch"
        )
    if elastic.rdzv is None:
        elastic.rdzv = "c10d"
        job.run.notes.append("rendezvous: c10d on the main node (a Batch multi-node job runs a fixed set of nodes)")
    if placement.max_runtime is None:
        job.run.notes.append("--max-runtime not given: no timeout (Batch's default); it bounds each attempt")
    return machine


def retry_note(job: Job, workload: Workload) -> str:
    count = request.attempts(job, workload)
    if count == 1:
        return "retries: none (this workload runs once: its first failure ends the job)"
    capped = f", Batch's most is {request.MAX_ATTEMPTS}" if count == request.MAX_ATTEMPTS else ""
    return (
        f"retries: up to {count} attempts of the whole job (--max-restarts {job.elastic.max_restarts} + 1{capped}), "
        "each resuming from the run's checkpoint on FSx"
    )


def on_mount(path: str, mount: str) -> bool:
    """Whether a path the containers resolve from their working directory (the FSx mount) stays on the volume."""
    root = PurePosixPath(mount)
    resolved = PurePosixPath(posixpath.normpath(root / path))
    return resolved == root or resolved.is_relative_to(root)


def check(job: Job) -> None:
    p, mount = job.parallelism, load_stack(outputs.load_outputs()).fsx_mount_path
    if p.min_nodes != p.nodes:
        raise SpecError(
            f"--nodes {p.min_nodes}:{p.nodes}: a Batch multi-node job runs a fixed number of nodes; give one count "
            f"(--nodes {p.nodes}); a lost node fails the attempt and the job's retry resumes from the checkpoint"
        )
    if job.placement.namespace is not None:
        raise SpecError(f"--namespace {job.placement.namespace} is for --target eks; drop it")
    gpus = hardware.INSTANCE_TYPES[str(job.placement.instance_type)].gpus
    if not 0 < p.nproc <= gpus:
        raise SpecError(
            f"--nproc {p.nproc}: a {job.placement.instance_type} node has {gpus} GPUs and each process takes one; "
            f"use --nproc 1..{gpus} (default: all)"
        )
    if job.placement.max_runtime is not None and job.placement.max_runtime < request.MIN_TIMEOUT_S:
        raise SpecError(
            f"--max-runtime {job.placement.max_runtime}: a Batch job's timeout is at least {request.MIN_TIMEOUT_S} s"
        )
    if not on_mount(job.run.runs_dir, mount):
        raise SpecError(
            f"--runs-dir {job.run.runs_dir}: on Batch runs live on the FSx volume every node mounts at {mount}, and "
            "this path leaves it; give a path inside it (default `runs`)"
        )
    if job.run.workload != "recipe":
        return
    weights = job.model.weights if job.model.init == "pretrained" else None
    read = (("--data", job.data.dataset), ("--eval-data", job.evaluation.data), ("--weights", weights))
    for flag, data in read:
        if data is None or data == SYNTHETIC:
            continue
        local = Path(data).expanduser().exists() and not PurePosixPath(data).is_relative_to(mount)
        if data.startswith("s3://") or local or not on_mount(data, mount):
            raise SpecError(
                f"{flag} {data}: Batch's nodes read {'model folders' if flag == '--weights' else 'data'} from the FSx "
                f"volume at {mount}; copy it there and give its path (or one relative to it"
                + ("; a relative owner/name is taken for a hub id" if flag == "--weights" else "")
                + "), a Hugging Face "
                + ("hub id" if flag == "--weights" else "dataset name")
                + (", or 'synthetic'" if flag == "--data" else "")
            )


def check_workload(workload: Workload, mount: str) -> None:
    if workload.wheelhouse is not None and not on_mount(workload.wheelhouse, mount):
        raise SpecError(
            f"--wheelhouse {workload.wheelhouse}: Batch's nodes install from the FSx volume and this path leaves it; "
            f"copy the wheels there and give a path under {mount} (or relative to it)"
        )


def requests_for(job: Job, workload: Workload, stack: BatchStack, secrets: dict[str, str]) -> tuple[dict, dict]:
    """(RegisterJobDefinition, SubmitJob), the second naming the first's definition by name (its ACTIVE revision)."""
    register = request.register_request(job, workload, stack, secrets)
    name = request.job_name(job.run.run_id, stamp())
    submit = request.submit_request(job, workload, stack, name, register["jobDefinitionName"])
    request.check_sizes(register, submit)
    return register, submit


def job_secrets(job: Job, workload: Workload, stack: BatchStack, clients: Clients | None = None) -> dict[str, str]:
    """{variable: secret ARN} of the credentials the job gets. With `clients` (a submission), only secrets that hold a
    value: ECS fails a container whose secret it cannot read (ResourceInitializationError), and a job without the
    Hugging Face token is refused earlier when it needs it (api.preflight)."""
    held = {c.env: stack.secret_arn(c) for c in job_credentials(job, workload) if stack.secret_arn(c)}
    return {env: arn for env, arn in held.items() if clients is None or secret_state(clients, arn) == "value"}


def dry_run_text(job: Job, workload: Workload, stack: BatchStack) -> str:
    register, submit = requests_for(job, workload, stack, job_secrets(job, workload, stack))
    return json.dumps({"registerJobDefinition": register, "submitJob": submit}, indent=2)


def submit_job(job: Job, workload: Workload, stack: BatchStack, clients: Clients) -> tuple[str, str]:
    """Preflight, the definition of the shape, SubmitJob; (job name, job id)."""
    if not stack.recorded:
        raise SpecError(f"{NOT_RECORDED}; a submission needs the real ones")
    problems = api.preflight(clients, job, workload, stack)
    secrets = job_secrets(job, workload, stack, clients)
    try:
        register, submit = requests_for(job, workload, stack, secrets)
    except SpecError as error:
        problems.append(str(error))
    if problems:
        raise SpecError("cannot submit to AWS Batch:\n  - " + "\n  - ".join(problems))
    api.keep_image(clients, job)
    submit["jobDefinition"] = api.definition(clients, register)
    job_id = api.submit(clients, submit)
    api.SUBMITTED.remember(job.run.run_id, id=job_id, name=submit["jobName"], region=clients.region)
    return submit["jobName"], job_id


class BatchBackend(AwsBackend):
    """An AWS Batch multi-node parallel job on the nodes of one instance type."""

    name = "batch"
    label = "Batch"

    def stack(self) -> BatchStack:
        return load_stack(outputs.load_outputs())

    def resolve(self, job: Job) -> Machine:
        return resolve(job)

    def check(self, job: Job) -> None:
        check(job)

    def storage_mb_s(self, job: Job) -> float | None:
        """The run folder is on the infra stack's FSx file system: its throughput per TiB x its size."""
        infra = outputs.load_outputs()
        return fsx_mb_s(infra.fsx_capacity_gib, infra.fsx_throughput_per_tib)

    def path_for(self, job: Job, path: str, flag: str) -> str:
        mount = self.stack().fsx_mount_path
        if not on_mount(path, mount):
            raise SpecError(f"{flag} {path}: on Batch the job works on the FSx volume; give a path under {mount}")
        return path

    def _stack(self) -> BatchStack:
        return self.stack()

    def _notes(self, job: Job, workload: Workload) -> list[str]:
        return [*job.run.notes, retry_note(job, workload)]

    def _check_workload(self, job: Job, workload: Workload, stack: BatchStack) -> None:
        check_workload(workload, stack.fsx_mount_path)

    def _dry_run_notes(self, job: Job, workload: Workload, stack: BatchStack) -> list[str]:
        notes = [] if stack.recorded else [NOT_RECORDED]
        notes += [f"a submission would be refused: {problem}" for problem in api.stack_problems(job, stack)]
        if job_secrets(job, workload, stack):
            notes.append("a token's secret is named in the definition only if it holds a value at submission")
        return notes

    def _dry_run(self, job: Job, workload: Workload, stack: BatchStack) -> str:
        return dry_run_text(job, workload, stack)

    def _submit(self, job: Job, workload: Workload, stack: BatchStack, clients: Clients) -> tuple[str, tuple]:
        name, job_id = submit_job(job, workload, stack, clients)
        return name, (f"id {job_id}",)

    def _newest(self, clients: Clients, run_id: str | None) -> tuple[str, str]:
        return jobs.newest_job(clients, self.stack(), run_id)

    def _status(self, clients: Clients, run_id: str, job: str) -> RunStatus:
        return jobs.status(clients, run_id, job)

    def _logs(self, clients: Clients, run_id: str, job: str, rank: int | None, follow: bool) -> Iterator[str]:
        """The main node's output, or one global rank's lines, from CloudWatch Logs."""
        return jobs.logs(clients, run_id, job, rank, follow)

    def _stop(self, clients: Clients, job: str) -> str:
        return jobs.stop(clients, job)

    def export_location(self, run_id: str | None) -> str:
        run = run_id or "<run-id>"
        folder = posixpath.join(self.stack().fsx_mount_path, "runs", run)
        return (
            f"its export is {folder}/{EXPORT_DIR} on the FSx volume the job's nodes mount; copy the run here without "
            f"its checkpoints from a machine that mounts it (`rsync -a --exclude checkpoints HOST:{folder}/ "
            f"runs/{run}/`), then run this again"
        )
