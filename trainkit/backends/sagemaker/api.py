"""The SageMaker backend's calls to AWS (boto3): the preflight before anything is created, the launch channel's
upload, CreateTrainingJob, and what `invoke status / logs / stop` read and do with a submitted job.

Preflight, in one pass so the user sees every problem at once, before anything is uploaded or created:
- the execution role exists (IAM GetRole), the runs bucket answers (S3 HeadBucket);
- the image is in this stack's ECR and holds trainkit (trainkit/backends/eks/image.py, as for EKS pods);
- `--init pretrained` (a workload that needs the token): the secret exists and holds a value (Secrets Manager
  DescribeSecret: a version staged AWSCURRENT; the value itself is never read here);
- no job of the same run is still InProgress or Stopping (ListTrainingJobs by the run's name prefix): two jobs
  would write one checkpoint prefix;
- the account's quota for the instance type covers `--nodes` instances: "<type> for training job usage", with
  `--spot` "<type> for spot training job usage" (Service Quotas; the names follow SageMaker's own
  ResourceLimitExceeded messages, "The account-level service limit 'ml.g4dn.xlarge for endpoint usage' is 0
  Instances"). Both are 0 by default for p4d/p5 accounts. The quota's code comes from ListAWSDefaultServiceQuotas,
  the account's value from GetServiceQuota (a quota never changed may have only its default).

Which job is a run's: job names are `<run id as a name>-<UTC stamp>` (request.job_name), and each submission's
name is also kept in the state folder (`.trainkit/sagemaker/<run id>.json`), so `invoke status --run-id` finds a
SageMaker run without `--target`.
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from training.common.files import node_events_file
from training.spec import SPEC_FILE, SUMMARY_FILE, Job
from trainkit.backends.aws import Clients, Submissions, s3_parts
from trainkit.backends.aws import error_code as _error_code
from trainkit.backends.aws import of_run as _of_run
from trainkit.backends.base import deadline_cause_line
from trainkit.backends.sagemaker import request
from trainkit.backends.sagemaker.stack import SageMakerStack
from trainkit.errors import SpecError
from trainkit.job.models import downloads_weights
from trainkit.run.state import RunState, RunStatus, finished_said, sagemaker_state, stopped_early
from trainkit.run.torchrun import GROUP_RANK
from trainkit.run.workload import Workload

ACTIVE = ("InProgress", "Stopping")
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
"""Where SageMaker writes a training job's container output: one stream per host, `<job>/algo-<n>-<epoch s>`
(Developer Guide, "Log Amazon SageMaker AI Events with Amazon CloudWatch")."""
FOLLOW_POLL_S = 5.0


SUBMITTED = Submissions("sagemaker")
"""Each submission's job name, by run (`.trainkit/sagemaker/<run id>.json`)."""


# --- preflight ---------------------------------------------------------------------------------------------------


def quotas(clients: Clients, names: list[str]) -> dict[str, float | None]:
    """The account's value of each SageMaker quota named: its code from the quotas' defaults
    (ListAWSDefaultServiceQuotas, read once), then the applied value (GetServiceQuota), which a quota nobody changed
    may not have: then its default. None: no quota of that name in this region."""
    client = clients("service-quotas")
    pages = client.get_paginator("list_aws_default_service_quotas").paginate(ServiceCode="sagemaker")
    defaults = {q.get("QuotaName"): q for page in pages for q in page.get("Quotas", [])}
    values: dict[str, float | None] = {}
    for name in names:
        found = defaults.get(name)
        if found is None:
            values[name] = None
            continue
        try:
            quota = client.get_service_quota(ServiceCode="sagemaker", QuotaCode=found["QuotaCode"])
            values[name] = quota["Quota"]["Value"]
        except client.exceptions.NoSuchResourceException:
            values[name] = found.get("Value")
    return values


def run_jobs(clients: Clients, run_id: str, status: str | None = None) -> list[dict]:
    """The run's training jobs (ListTrainingJobs by its name prefix), in one status or any."""
    prefix = request.job_name(run_id, "")[:-1]
    filters = {"NameContains": prefix[:63], **({"StatusEquals": status} if status else {})}
    pages = clients("sagemaker").get_paginator("list_training_jobs").paginate(**filters)
    return [job for page in pages for job in page["TrainingJobSummaries"] if _of_run(job["TrainingJobName"], prefix)]


def running_jobs(clients: Clients, run_id: str) -> list[str]:
    """The run's jobs still InProgress or Stopping."""
    return [job["TrainingJobName"] for status in ACTIVE for job in run_jobs(clients, run_id, status)]


DATASETS_PREFIX = "datasets/"
"""Where a dataset may live in the runs bucket (the execution role reads it there, terraform/modules/sagemaker)."""


def preflight(clients: Clients, job: Job, workload: Workload, stack: SageMakerStack) -> list[str]:
    """Every reason the job cannot be submitted, each saying what to change (empty: go)."""
    from botocore.exceptions import ClientError

    from trainkit.backends.eks.image import image_problems

    problems: list[str] = []
    role = stack.role_arn.rsplit("/", 1)[-1]
    try:
        clients("iam").get_role(RoleName=role)
    except ClientError as error:
        problems.append(
            f"execution role {stack.role_arn}: {_error_code(error)}; `make up PROFILE=aws` with "
            "sagemaker_enabled = true creates it"
        )
    try:
        clients("s3").head_bucket(Bucket=stack.bucket)
    except ClientError as error:
        problems.append(f"runs bucket {stack.bucket}: {_error_code(error)}; `make up PROFILE=aws` creates it")
    problems += image_problems(job, clients("ecr"))
    if job.run.workload == "recipe" and downloads_weights(job):  # weights from S3, and other runs, need no token
        problems += _secret_problems(clients, stack)
    running = running_jobs(clients, job.run.run_id)
    if running:
        problems.append(
            f"run {job.run.run_id} is still running as SageMaker job {running[0]} (two jobs would write one "
            f"checkpoint prefix): wait for it, or `invoke stop --run-id {job.run.run_id}`"
        )
    problems += _data_problems(job, stack)
    problems += _quota_problems(clients, job)
    return problems


def _data_problems(job: Job, stack: SageMakerStack) -> list[str]:
    """An s3:// dataset must be where the execution role may read it (terraform/modules/sagemaker: the runs
    bucket's datasets/ prefix and the data_source_buckets); else the job would start, pay for its instances and fail
    downloading its channel."""
    readable = ", ".join((f"s3://{stack.bucket}/{DATASETS_PREFIX}", *(f"s3://{b}/" for b in stack.data_buckets)))
    problems = []
    for channel, data in request.s3_data(job).items():
        bucket, key = s3_parts(data)
        if (bucket == stack.bucket and key.startswith(DATASETS_PREFIX)) or bucket in stack.data_buckets:
            continue
        flag = {request.EVAL_CHANNEL: "--eval-data", request.WEIGHTS_CHANNEL: "--weights"}.get(channel, "--data")
        problems.append(
            f"{flag} {data}: the execution role may read datasets only under {readable}: upload it under "
            f's3://{stack.bucket}/{DATASETS_PREFIX}, or add "{bucket}" to data_source_buckets in '
            "terraform/stacks/infra/terraform.tfvars and run `make up PROFILE=aws`"
        )
    return problems


def _secret_problems(clients: Clients, stack: SageMakerStack) -> list[str]:
    from botocore.exceptions import ClientError

    store = "`invoke secrets.hf-token --target sagemaker` stores it (from a prompt or a file, never a flag)"
    if not stack.hf_token_secret_arn:
        return [f"--init pretrained needs the Hugging Face token and the stack records no secret for it; {store}"]
    try:
        described = clients("secretsmanager").describe_secret(SecretId=stack.hf_token_secret_arn)
    except ClientError as error:
        return [f"Hugging Face token secret {stack.hf_token_secret_arn}: {_error_code(error)}; {store}"]
    stages = [stage for stages in described.get("VersionIdsToStages", {}).values() for stage in stages]
    if "AWSCURRENT" not in stages:
        return [f"Hugging Face token secret {stack.hf_token_secret_arn} holds no value yet; {store}"]
    return []


def _quota_problems(clients: Clients, job: Job) -> list[str]:
    instance = request.INSTANCE_PREFIX + str(job.placement.instance_type)
    names = [f"{instance} for training job usage"]
    if job.placement.spot:
        names.append(f"{instance} for spot training job usage")
    problems = []
    for name, value in quotas(clients, names).items():
        if value is None:
            problems.append(f"no SageMaker quota named {name!r} in this region: is {instance} offered here?")
        elif value < job.parallelism.nodes:
            problems.append(
                f"the account's quota {name!r} is {value:g} instance(s) and the job needs {job.parallelism.nodes}: "
                "request an increase in the Service Quotas console (SageMaker), or lower --nodes"
            )
    return problems


# --- submit ------------------------------------------------------------------------------------------------------


def keep_image(clients: Clients, job: Job) -> None:
    """Tag the image run-<run id> (the repository's lifecycle rule keeps it while the run may resume on it)."""
    from trainkit.backends.eks.image import check_image

    check_image(job, clients("ecr"))  # its note, if any, the preflight printed


def upload(clients: Clients, files: dict[str, bytes]) -> None:
    """The launch channel's files, each to its s3:// URI (the bucket encrypts with its own key)."""
    s3 = clients("s3")
    for uri, data in files.items():
        bucket, key = s3_parts(uri)
        s3.put_object(Bucket=bucket, Key=key, Body=data)


def create(clients: Clients, body: dict) -> str:
    return clients("sagemaker").create_training_job(**body)["TrainingJobArn"]


# --- status, logs, stop ------------------------------------------------------------------------------------------


def newest_job(clients: Clients, run_id: str | None) -> tuple[str, str]:
    """(run id, the name of its newest job); without a run id, the run this machine submitted last."""
    run_id = run_id or SUBMITTED.last_run()
    if run_id is None:
        raise SpecError("no SageMaker run submitted from here: give --run-id")
    submitted = SUBMITTED.newest(run_id)
    if submitted is not None:
        return run_id, submitted["name"]
    jobs = run_jobs(clients, run_id)
    if not jobs:
        prefix = request.job_name(run_id, "")[:-1]
        raise SpecError(f"no SageMaker training job of run {run_id} in this region (names start {prefix}-)")
    return run_id, max(jobs, key=lambda j: j["CreationTime"])["TrainingJobName"]


def _clock(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if isinstance(value, datetime) else str(value)


MAX_RUNTIME_EXCEEDED = "MaxRuntimeExceeded"
"""The SecondaryStatus of a job SageMaker stopped at its StoppingCondition.MaxRuntimeInSeconds (--max-runtime); its
TrainingJobStatus is Stopped and it has no FailureReason (API reference, DescribeTrainingJob: SecondaryStatus)."""


def deadline_cause(job: dict, run_id: str) -> str | None:
    """The one line of a job SageMaker stopped at its --max-runtime deadline (DescribeTrainingJob), or None."""
    if job.get("SecondaryStatus") != MAX_RUNTIME_EXCEEDED:
        return None
    limit = job.get("StoppingCondition", {}).get("MaxRuntimeInSeconds")
    return deadline_cause_line(
        limit,
        "of training, StoppingCondition.MaxRuntimeInSeconds",
        "SageMaker sent SIGTERM, and the run saves a checkpoint at the step boundary when its 120 s grace allows",
        run_id,
    )


def status(clients: Clients, run_id: str, name: str) -> RunStatus:
    """The state; status, the secondary status transitions with their times, the failure reason or the deadline that
    stopped the job, billable and spot-saved seconds (DescribeTrainingJob)."""
    job = clients("sagemaker").describe_training_job(TrainingJobName=name)
    resources = job.get("ResourceConfig", {})
    state = sagemaker_state(job["TrainingJobStatus"], job.get("SecondaryStatus"))
    early = stopped_early(_summary(clients, job, run_id)) if state is RunState.FINISHED else None
    lines = [
        f"SageMaker job {name} (run {run_id}): {finished_said(state, early)}",
        f"  status {job['TrainingJobStatus']} / {job.get('SecondaryStatus', '-')}, "
        f"{resources.get('InstanceCount', '?')} x {resources.get('InstanceType', '?')}"
        + (", managed spot" if job.get("EnableManagedSpotTraining") else ""),
    ]
    if job.get("FailureReason"):
        lines.append(f"  failed: {job['FailureReason']}")
    cause = deadline_cause(job, run_id)
    if cause:
        lines.append(f"  cause: {cause}")
    training, billable = job.get("TrainingTimeInSeconds"), job.get("BillableTimeInSeconds")
    if training is not None:
        saved = f", spot saved {1 - billable / training:.0%}" if billable is not None and training else ""
        lines.append(f"  training {training} s, billable {billable if billable is not None else '-'} s{saved}")
    for step in job.get("SecondaryStatusTransitions", []):
        end = f" -> {_clock(step['EndTime'])}" if step.get("EndTime") else ""
        message = f": {step['StatusMessage']}" if step.get("StatusMessage") else ""
        lines.append(f"  {_clock(step['StartTime'])}{end}  {step['Status']}{message}")
    final = job.get("FinalMetricDataList") or []  # the metric definitions' last values, read off the log
    if final:
        shown = ", ".join(f"{m['MetricName']} {m['Value']:.4g}" for m in final)
        lines.append(f"  metrics {shown}")
    checkpoint = job.get("CheckpointConfig", {}).get("S3Uri")
    if checkpoint:
        lines.append(f"  checkpoints {checkpoint}")
    return RunStatus(state, "\n".join(lines))


def launch_spec(clients: Clients, described: dict) -> Job:
    """The job as submitted: spec.json in the job's launch channel (its processes per host, its run id)."""
    channel = next(c for c in described["InputDataConfig"] if c["ChannelName"] == request.LAUNCH_CHANNEL)
    bucket, key = s3_parts(channel["DataSource"]["S3DataSource"]["S3Uri"])
    body = clients("s3").get_object(Bucket=bucket, Key=key.rstrip("/") + "/" + SPEC_FILE)["Body"].read()
    return Job.from_dict(json.loads(body))


def hosts_by_group_rank(clients: Clients, name: str, count: int) -> dict[int, str]:
    """{group rank: host} from the latest rendezvous round each host's agent logged (torchrun assigns group
    ranks at the rendezvous, not by host name)."""
    found = {}
    for index in range(1, count + 1):
        host = f"algo-{index}"
        ranks = [rank for line in log_lines(clients, name, host) for rank in GROUP_RANK.findall(line)]
        if ranks:
            found[int(ranks[-1])] = host
    return found


def log_lines(clients: Clients, name: str, host: str, follow: bool = False) -> Iterator[str]:
    """One host's container output from CloudWatch Logs; `follow`: until the job ends."""
    logs = clients("logs")
    streams: dict[str, str | None] = {}
    while True:
        found = logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{name}/{host}-")
        for stream in found.get("logStreams", []):
            streams.setdefault(stream["logStreamName"], None)
        for stream, token in streams.items():
            while True:
                kwargs = {"nextToken": token} if token else {"startFromHead": True}
                page = logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=stream, **kwargs)
                for event in page["events"]:
                    yield event["message"]
                if page.get("nextForwardToken") in (None, token):
                    break
                token = streams[stream] = page["nextForwardToken"]
        if not follow:
            return
        state = clients("sagemaker").describe_training_job(TrainingJobName=name)["TrainingJobStatus"]
        if state not in ACTIVE:
            follow = False  # one more pass picks up what the last moments wrote
        else:
            time.sleep(FOLLOW_POLL_S)


RUN_FILES = (SPEC_FILE, "metrics.jsonl", SUMMARY_FILE, "events.jsonl")
"""What `invoke obs.report` reads of a run (trainkit/plan/report.py), with each host agent's events file."""


def _run_folder(described: dict, run_id: str) -> tuple[str, str]:
    """(bucket, key prefix) of the run folder in the job's checkpoint prefix, where the hosts' run folder
    (<LocalPath>/<run id>) is synced."""
    bucket, prefix = s3_parts(described["CheckpointConfig"]["S3Uri"])
    return bucket, f"{prefix.rstrip('/')}/{run_id}/"


def _run_file(clients: Clients, described: dict, run_id: str, file: str) -> bytes | None:
    """One file of the synced run folder, None where it is not (yet) there."""
    bucket, folder = _run_folder(described, run_id)
    s3 = clients("s3")
    try:
        return s3.get_object(Bucket=bucket, Key=folder + file)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None


def _summary(clients: Clients, described: dict, run_id: str) -> dict:
    """The run's summary.json as its hosts synced it, {} without one."""
    body = _run_file(clients, described, run_id, SUMMARY_FILE) if described.get("CheckpointConfig") else None
    try:
        return json.loads(body) if body else {}
    except ValueError:
        return {}


def fetch_run_files(clients: Clients, name: str, run_id: str, into: Path) -> list[str]:
    """The run's small files from its checkpoint prefix, where the hosts' run folder is synced; the names fetched."""
    described = clients("sagemaker").describe_training_job(TrainingJobName=name)
    bucket, folder = _run_folder(described, run_id)
    fetched = []
    into.mkdir(parents=True, exist_ok=True)
    listed = clients("s3").list_objects_v2(Bucket=bucket, Prefix=folder + "events.", Delimiter="/").get("Contents", [])
    names = [item["Key"][len(folder) :] for item in listed]
    nodes = [name for name in names if fnmatch.fnmatch(name, node_events_file("*"))]  # each host's agent's events
    for file in (*RUN_FILES, *nodes):
        body = _run_file(clients, described, run_id, file)
        if body is not None:
            (into / file).write_bytes(body)
            fetched.append(file)
    return fetched


def stop(clients: Clients, name: str) -> str:
    client = clients("sagemaker")
    state = client.describe_training_job(TrainingJobName=name)["TrainingJobStatus"]
    if state not in ACTIVE:
        return f"SageMaker job {name} is {state}; nothing to stop"
    if state == "InProgress":
        client.stop_training_job(TrainingJobName=name)
    return (
        f"stopping SageMaker job {name}: its containers get SIGTERM, the run saves a checkpoint at the step boundary "
        "and SageMaker uploads it; the same `invoke train ... --target sagemaker` resumes it"
    )
