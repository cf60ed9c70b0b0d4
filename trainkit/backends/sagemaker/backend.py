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
from collections.abc import Iterator
from pathlib import Path

from training.spec import EXPORT_DIR, SPEC_FILE, Job
from trainkit.backends.aws import AwsBackend, Clients, stamp
from trainkit.backends.base import cloud_machine
from trainkit.backends.sagemaker import api, request
from trainkit.backends.sagemaker.stack import NOT_RECORDED, SageMakerStack, load_stack
from trainkit.errors import SpecError
from trainkit.infra import outputs
from trainkit.job.build import Machine
from trainkit.job.tracking import stack_tracking
from trainkit.run.code import read_code
from trainkit.run.state import RunStatus
from trainkit.run.storage import GP3_BASELINE_MB_S
from trainkit.run.torchrun import rank_prefix
from trainkit.run.workload import WORKLOAD_FILE, Workload


def resolve(job: Job) -> Machine:
    infra = outputs.load_outputs()
    placement, elastic = job.placement, job.elastic
    placement.instance_type = request.instance_key(placement.instance_type or infra.instance_type)
    machine = cloud_machine(job, infra.default_image, request.INSTANCE_PREFIX)
    stack_tracking(job, infra)
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
    # What the request will say (its defaults filled in), checked before anything is uploaded: CreateTrainingJob
    # refuses a MaxRuntimeInSeconds over 28 days and a MaxWaitTimeInSeconds shorter than it (API reference,
    # StoppingCondition), which botocore's model does not check.
    condition = request.stopping_condition(job)
    runtime, wait = condition["MaxRuntimeInSeconds"], condition.get("MaxWaitTimeInSeconds")
    if runtime > request.MAX_RUNTIME_LIMIT_S:
        raise SpecError(
            f"--max-runtime {runtime} s is more than SageMaker allows a training job, 28 days "
            f"({request.MAX_RUNTIME_LIMIT_S} s): give at most 28d and resume the run with a second job"
        )
    if wait is not None and wait < runtime:
        given = "--max-runtime" if job.placement.max_runtime else f"SageMaker's default runtime ({runtime} s)"
        raise SpecError(
            f"--max-wait {wait} s is shorter than {given}: a spot job's wait includes its run, so give "
            f"--max-wait {runtime} or more (or a shorter --max-runtime)"
        )
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
    weights = job.model.weights if job.model.init == "pretrained" else None
    if weights and not weights.startswith("s3://") and Path(weights).expanduser().exists():
        raise SpecError(
            f"--weights {weights} is on this machine, which SageMaker's instances cannot read; upload the model folder "
            "and give its s3:// prefix (it becomes the job's weights channel), or a Hugging Face hub id"
        )
    held_out = job.evaluation.data
    if held_out and not held_out.startswith("s3://") and Path(held_out).expanduser().exists():
        raise SpecError(
            f"--eval-data {held_out} is on this machine, which SageMaker's instances cannot read; upload it and give "
            "its s3:// prefix (it becomes the job's eval channel)"
        )


def launch_files(job: Job, workload: Workload) -> dict[str, bytes]:
    """The launch channel (request.LAUNCH_CHANNEL), by name inside it: the spec, the workload, a script's code."""
    files = {
        SPEC_FILE: (json.dumps(job.to_dict(), indent=2) + "\n").encode(),
        WORKLOAD_FILE: workload.to_json().encode(),
    }
    if workload.code is not None:
        files |= {f"code/{name}": data for name, data in read_code(Path(workload.code), job.run.runs_dir).items()}
    return files


def shown_uploads(files: dict[str, bytes], prefix: str) -> dict:
    """The dry run's view of the upload: the spec and workload as JSON, a script's code as its file names."""
    code = sorted(name.removeprefix("code/") for name in files if name.startswith("code/"))
    shown = {prefix + name: json.loads(files[name]) for name in (SPEC_FILE, WORKLOAD_FILE)}
    if code:
        shown[prefix + "code/"] = f"{len(code)} file(s): {', '.join(code)}"
    return shown


def dry_run_text(job: Job, workload: Workload, stack: SageMakerStack, region: str | None) -> str:
    """The request (`request`, as CreateTrainingJob takes it) and the launch channel's files (`uploads`)."""
    name = request.job_name(job.run.run_id, stamp())
    body = request.render(job, workload, stack, name, region)
    prefix = request.launch_prefix(stack, job.run.run_id, name)
    return json.dumps({"request": body, "uploads": shown_uploads(launch_files(job, workload), prefix)}, indent=2)


def submit_job(job: Job, workload: Workload, stack: SageMakerStack, clients: Clients) -> str:
    """Preflight, upload the launch channel, CreateTrainingJob; the job's name."""
    if not stack.recorded:
        raise SpecError(f"{NOT_RECORDED}; a submission needs the real ones")
    problems = api.preflight(clients, job, workload, stack)
    if problems:
        raise SpecError("cannot submit to SageMaker:\n  - " + "\n  - ".join(problems))
    api.keep_image(clients, job)
    name = request.job_name(job.run.run_id, stamp())
    prefix = request.launch_prefix(stack, job.run.run_id, name)
    api.upload(clients, {prefix + rel: data for rel, data in launch_files(job, workload).items()})
    api.create(clients, request.render(job, workload, stack, name, clients.region_name()))
    api.SUBMITTED.remember(job.run.run_id, name=name, region=clients.region)
    return name


class SageMakerBackend(AwsBackend):
    """A SageMaker training job (CreateTrainingJob) on the instances of one instance type."""

    name = "sagemaker"
    label = "SageMaker"

    def resolve(self, job: Job) -> Machine:
        return resolve(job)

    def check(self, job: Job) -> None:
        check(job)

    def storage_mb_s(self, job: Job) -> float | None:
        """Each host writes its part of a checkpoint to its own volume (SageMaker uploads it to S3 from there:
        trainkit/backends/sagemaker/restore.py): assumed an EBS gp3 volume at its baseline, the slow end of what it
        may be."""
        return round(GP3_BASELINE_MB_S, 1)

    def storage_hosts(self, job: Job) -> int:
        return job.parallelism.nodes

    def _stack(self) -> SageMakerStack:
        return load_stack(outputs.load_outputs())

    def _dry_run_notes(self, job: Job, workload: Workload, stack: SageMakerStack) -> list[str]:
        return [] if stack.recorded else [NOT_RECORDED]

    def _dry_run(self, job: Job, workload: Workload, stack: SageMakerStack) -> str:
        return dry_run_text(job, workload, stack, self.clients().region_name())

    def _submit(self, job: Job, workload: Workload, stack: SageMakerStack, clients: Clients) -> tuple[str, tuple]:
        return submit_job(job, workload, stack, clients), ()

    def _newest(self, clients: Clients, run_id: str | None) -> tuple[str, str]:
        return api.newest_job(clients, run_id)

    def _status(self, clients: Clients, run_id: str, job: str) -> RunStatus:
        return api.status(clients, run_id, job)

    def _logs(self, clients: Clients, run_id: str, job: str, rank: int | None, follow: bool) -> Iterator[str]:
        """The leader's output (group rank 0's host), or one global rank's lines, from CloudWatch Logs."""
        described = clients("sagemaker").describe_training_job(TrainingJobName=job)
        nproc = api.launch_spec(clients, described).parallelism.nproc
        hosts = described["ResourceConfig"]["InstanceCount"]
        if rank is not None and not 0 <= rank < hosts * nproc:
            raise SpecError(f"--rank {rank}: job {job} has ranks 0-{hosts * nproc - 1} ({hosts} x {nproc})")
        by_rank = api.hosts_by_group_rank(clients, job, hosts)
        group = 0 if rank is None else rank // nproc
        if group not in by_rank:
            state = described["TrainingJobStatus"]
            raise SpecError(f"no host of job {job} has logged group rank {group} yet ({state}): see `invoke status`")
        prefix = "" if rank is None else rank_prefix(rank, nproc)
        yield f"==> {job}/{by_rank[group]}" + (" (leader)" if rank is None else f" (rank {rank})")
        yield from (line for line in api.log_lines(clients, job, by_rank[group], follow) if line.startswith(prefix))

    def _stop(self, clients: Clients, job: str) -> str:
        return api.stop(clients, job)

    def export_location(self, run_id: str | None) -> str:
        run = run_id or api.newest_job(self.clients(), None)[0]
        folder = f"{request.checkpoint_prefix(self._stack(), run)}{run}/"
        return (
            f"its export is {folder}{EXPORT_DIR}/ in S3 (SageMaker syncs the run folder there); copy the run "
            f"here without its checkpoints: `aws s3 sync {folder} runs/{run}/ --exclude 'checkpoints/*'`, then run "
            "this again"
        )

    def fetch_run_files(self, run_id: str, into: Path) -> bool:
        clients = self.clients()
        _run_id, name = api.newest_job(clients, run_id)
        return bool(api.fetch_run_files(clients, name, run_id, into))
