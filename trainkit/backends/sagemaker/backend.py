"""SageMaker Training backend: the job as a CreateTrainingJob request, through boto3 (already a dependency; the
SageMaker Python SDK would add about 120 packages, docs/sagemaker.md says more).

`resolve` maps the instance type onto the instance table (`ml.p5.48xlarge` and `p5.48xlarge` name the same row),
one process per GPU, the run folder under the checkpoint path SageMaker syncs with S3, and a c10d rendezvous on the
first host (SageMaker runs a fixed set of instances and no etcd). `check` refuses what SageMaker cannot do (an
elastic range, an etcd rendezvous, a namespace, a dataset on this machine's disk). `--dry-run` prints the request
and what would be uploaded for it, and contacts nothing.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from training.common.job import SPEC_FILE, Job
from trainkit.backends.base import WORKLOAD_FILE, Backend, RunRef, Workload, cloud_machine
from trainkit.backends.sagemaker import request
from trainkit.backends.sagemaker.stack import NOT_RECORDED, load_stack
from trainkit.errors import SpecError
from trainkit.infra import outputs
from trainkit.job.build import Machine
from trainkit.run.code import read_code

NOT_YET = (
    "--target sagemaker submits nothing yet: --dry-run prints the request; submitting, `invoke status`, `logs` and "
    "`stop` are being built (docs/sagemaker.md)"
)


def resolve(job: Job) -> Machine:
    infra = outputs.load_outputs()
    placement, elastic = job.placement, job.elastic
    placement.instance_type = request.instance_key(placement.instance_type or infra.instance_type)
    machine = cloud_machine(job, infra.default_image, request.INSTANCE_PREFIX)
    if job.run.runs_dir == "runs":  # the profile's default: on SageMaker the run folder is what it syncs to S3
        job.run.runs_dir = request.CHECKPOINTS
    if elastic.rdzv not in (None, "c10d") or elastic.rdzv_endpoint:
        raise SpecError(
            "--rdzv/--rdzv-endpoint: a SageMaker job meets on its first host (c10d); drop them for --target sagemaker"
        )
    if elastic.rdzv is None:
        elastic.rdzv = "c10d"
        job.run.notes.append("rendezvous: c10d on the first host (SageMaker runs a fixed set of instances)")
    if placement.max_runtime is None:
        job.run.notes.append(
            f"--max-runtime not given: SageMaker's default stopping condition, {request.DEFAULT_MAX_RUNTIME_S} s"
        )
    return machine


def check(job: Job) -> None:
    p = job.parallelism
    if p.min_nodes != p.nodes:
        raise SpecError(
            f"--nodes {p.min_nodes}:{p.nodes}: SageMaker runs a job on a fixed number of instances; give one count "
            f"(--nodes {p.nodes}); a spot interruption restarts the whole job from its last checkpoint instead"
        )
    if job.placement.namespace is not None:
        raise SpecError(f"--namespace {job.placement.namespace} is for --target eks; drop it")
    if job.run.runs_dir != request.CHECKPOINTS:
        raise SpecError(
            f"--runs-dir {job.run.runs_dir}: on SageMaker the run folder lives under {request.CHECKPOINTS}, which "
            "SageMaker syncs with the run's S3 prefix; drop --runs-dir"
        )
    data = job.data.dataset
    if job.run.workload == "recipe" and Path(data).expanduser().exists() and not data.startswith("s3://"):
        raise SpecError(
            f"--data {data} is on this machine, which SageMaker's instances cannot read; upload it and give its "
            "s3:// prefix (it becomes the job's data channel)"
        )


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def uploads(job: Job, workload: Workload, prefix: str) -> dict:
    """What the launcher puts under the submission's launch prefix before CreateTrainingJob: the launch channel."""
    found = {prefix + SPEC_FILE: job.to_dict(), prefix + WORKLOAD_FILE: json.loads(workload.to_json())}
    if workload.code is not None:
        files = sorted(str(path) for path in read_code(Path(workload.code)))
        found[prefix + "code/"] = f"{len(files)} file(s) of {workload.code}: {', '.join(files)}"
    return found


def dry_run_text(job: Job, workload: Workload) -> str:
    """The request (`request`, as CreateTrainingJob takes it) and the launch channel's files (`uploads`)."""
    stack = load_stack(outputs.load_outputs())
    if not stack.recorded:
        print(f"note: {NOT_RECORDED}", file=sys.stderr, flush=True)
    name = request.job_name(job.run.run_id, stamp())
    body = request.render(job, workload, stack, name)
    prefix = request.launch_prefix(stack, job.run.run_id, name)
    return json.dumps({"request": body, "uploads": uploads(job, workload, prefix)}, indent=2)


class SageMakerBackend(Backend):
    """A SageMaker training job (CreateTrainingJob) on the instances of one instance type."""

    name = "sagemaker"

    def resolve(self, job: Job) -> Machine:
        return resolve(job)

    def check(self, job: Job) -> None:
        check(job)

    def submit(self, job: Job, workload: Workload, dry_run: bool = False) -> int:
        for note in job.run.notes:  # stderr: with --dry-run, stdout is only the request
            print(f"note: {note}", file=sys.stderr, flush=True)
        if not workload.distributed:
            raise SpecError("--target sagemaker runs training jobs; run data tasks with --target local or eks")
        if not dry_run:
            raise SpecError(NOT_YET)
        print(dry_run_text(job, workload), flush=True)
        return 0

    def status(self, ref: RunRef) -> str:
        raise SpecError(NOT_YET)

    def logs(self, ref: RunRef, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        raise SpecError(NOT_YET)

    def stop(self, ref: RunRef) -> str:
        raise SpecError(NOT_YET)
