"""A job as the CreateTrainingJob request SageMaker Training runs (API 2017-07-24; the tests validate every request
against botocore's service model, tests/helpers/aws_model.py).

What goes where, and why:

- The spec, the workload and a script's code travel in the `trainkit` input channel (File mode): the launcher
  uploads them under the run's S3 prefix. Environment values stop at 512 characters and hyperparameters at 2,500,
  and DescribeTrainingJob shows both to anyone who may describe jobs, so neither carries the spec, and no request
  field carries a secret: the Hugging Face token stays in Secrets Manager and the request names its ARN only.
- Checkpoints: `CheckpointConfig` syncs `/opt/ml/checkpoints` with `<prefix>/checkpoints` while the job runs and
  restores it onto every instance when a job (or a spot restart) starts (SageMaker Developer Guide, "Use
  checkpoints in Amazon SageMaker AI"); the run folder lives there, so the same run id resumes across jobs.
- Data: an `s3://` dataset is the `data` channel, an `s3://` --eval-data the `eval` channel and `s3://` pretrained
  --weights the `weights` channel, in FastFile mode
  (streamed on first read, no copy before the first step; Developer Guide, "Setting up training jobs to access
  datasets": FastFile suits sequential reads of large files); the generated data of the recipes is made on the
  instances.
- The instance count is fixed: SageMaker runs a job on exactly `InstanceCount` instances (no elastic range).
- Encryption: the job's output (`OutputDataConfig.KmsKeyId`) with the stack's KMS key; its volume
  (`ResourceConfig.VolumeKmsKeyId`) too where the instance type has no local storage (`volume_encryption`); the
  traffic between its instances (`EnableInterContainerTrafficEncryption`) as the stack chose, off by default.
"""

from __future__ import annotations

import functools
import json
import math
import re
from importlib.resources import files

from training.families import Throughput, family_of
from training.spec import Job
from training.text.holdout import evaluates
from trainkit.backends.sagemaker.restore import CHECKPOINT_S3_ENV
from trainkit.backends.sagemaker.stack import SageMakerStack
from trainkit.hardware import INSTANCE_TABLE
from trainkit.infra.outputs import STACK_TAG
from trainkit.job.models import get_model
from trainkit.run.secrets import job_credentials
from trainkit.run.storage import GB, storage_need
from trainkit.run.torchrun import TORCH_ENV
from trainkit.run.workload import Workload

ENTRY = ("python3", "-m", "trainkit.backends.sagemaker.host")
"""The container's entry point (AlgorithmSpecification.ContainerEntrypoint): torchrun on every host."""
CHECKPOINTS = "/opt/ml/checkpoints"
"""CheckpointConfig.LocalPath (SageMaker's default); the run folder lives under it."""
REGION_ENV = "TRAINKIT_AWS_REGION"
"""The job's region, in its Environment: each host's boto3 clients take it as AWS_DEFAULT_REGION (host.py)."""
LAUNCH_CHANNEL = "trainkit"
DATA_CHANNEL = "data"
EVAL_CHANNEL = "eval"
WEIGHTS_CHANNEL = "weights"
DEFAULT_MAX_RUNTIME_S = 86_400
"""StoppingCondition.MaxRuntimeInSeconds when --max-runtime is not given: SageMaker's own default, one day (API
reference, StoppingCondition)."""
SPOT_WAIT_FACTOR = 2
"""--max-wait's default with --spot: twice the runtime, so a job may wait as long for capacity as it runs."""
MAX_RUNTIME_LIMIT_S = 28 * 86_400
"""StoppingCondition.MaxRuntimeInSeconds' maximum for a training job, 28 days (API reference, StoppingCondition;
CloudFormation's AWS::SageMaker StoppingCondition: "The maximum value is 28 days"). botocore's model states no maximum,
so CreateTrainingJob would refuse it only after the launch files were uploaded."""

INSTANCE_PREFIX = "ml."
SPARE_GB = 50
"""Beyond what the run writes: the image's layers, the data the instance stages, logs (an EBS volume; instances
with local NVMe use that instead and ignore a larger figure: API reference, ResourceConfig.VolumeSizeInGB)."""
NAME_LIMIT = 63
TAG_RUN = "trainkit:run-id"
TAG_MODEL = "trainkit:model"
# SageMaker reads metrics from the leader's log with these (the progress lines of training/common/progress.py:
# `<run> step 12/60 (20%) loss=2.3102 tok_s=4301 [8 s]`); the first group is the value.
LOSS_METRIC = ("loss", r"step \d+/\d+ \(\d+%\) loss=([0-9.eE+-]+)")


def rate_metric(throughput: Throughput) -> tuple[str, str]:
    """A family's rate as a metric definition: its name, and the regex whose first group reads the rate off the
    progress line (`tok_s=4301`; training/common/progress.py)."""
    return throughput.metric, rf"step \d+/\d+ \(\d+%\) .*{re.escape(throughput.progress)}=([0-9.]+)"


def instance_key(instance_type: str) -> str:
    """`ml.p5.48xlarge` (SageMaker's name) or `p5.48xlarge` -> the instance table's key."""
    return instance_type.removeprefix(INSTANCE_PREFIX)


def job_name(run_id: str, stamp: str) -> str:
    """A training job name is unique in the account and region for good (even after the job ends), so every
    submission of a run gets its own: the run id made to fit [a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}, then a stamp."""
    slug = re.sub(r"[^a-zA-Z0-9]+", "-", run_id).strip("-")
    return f"{slug[: NAME_LIMIT - len(stamp) - 1].rstrip('-')}-{stamp}"


def run_prefix(stack: SageMakerStack, run_id: str) -> str:
    return f"s3://{stack.bucket}/runs/{run_id}"


def checkpoint_prefix(stack: SageMakerStack, run_id: str) -> str:
    """Apart from the run's other files, so the bucket's lifecycle rule can expire old checkpoints by prefix
    (terraform/modules/sagemaker). It ends in `/`: SageMaker restores every object whose key starts with the
    prefix, so without it run `exp1` would also restore `exp10/` (syne-tune/syne-tune#363)."""
    return f"s3://{stack.bucket}/checkpoints/{run_id}/"


def launch_prefix(stack: SageMakerStack, run_id: str, name: str) -> str:
    """Where the launcher uploads what the instances start from (one folder per submission)."""
    return f"{run_prefix(stack, run_id)}/launch/{name}/"


def volume_gb(job: Job) -> int:
    """The instance volume: what the run writes at its peak (trainkit/run/storage.py) with a quarter to spare, plus
    SPARE_GB for the image and the data."""
    if job.run.workload != "recipe":
        return 2 * SPARE_GB
    need = storage_need(job, get_model(job.model.name))
    return math.ceil(need.total * 1.25 / GB) + SPARE_GB


@functools.cache
def _instance_store() -> dict[str, bool]:
    table = json.loads(files("trainkit").joinpath(*INSTANCE_TABLE).read_text())
    return {name: row["instance_store"] for name, row in table.items() if not name.startswith("_")}


def has_instance_store(instance_type: str) -> bool:
    """Whether the type has local (NVMe instance-store) storage, per the instance table; a type it does not know
    counts as having it, so no request names a volume key SageMaker would refuse."""
    return _instance_store().get(instance_key(instance_type), True)


def volume_encryption(instance_type: str, stack: SageMakerStack) -> dict:
    """ResourceConfig.VolumeKmsKeyId: the stack's key, for an instance type whose storage is an EBS volume. SageMaker
    refuses the key for a type with local storage, which is "encrypted using a hardware module on the instance" (API
    reference, ResourceConfig.VolumeKmsKeyId; XTS-AES-256, EC2 User Guide, "Data protection in Amazon EC2"), and every
    type of the instance table has it: so today no request names one."""
    if stack.kms_key_arn is None or has_instance_store(instance_type):
        return {}
    return {"VolumeKmsKeyId": stack.kms_key_arn}


def output_config(stack: SageMakerStack, prefix: str) -> dict:
    """OutputDataConfig: model.tar.gz under the run's prefix, encrypted with the stack's key (the execution role may
    use it through S3 only, terraform/modules/sagemaker); outputs recorded before the stack exported its key leave
    it to the bucket's default encryption, which is the same key."""
    return {"S3OutputPath": f"{prefix}/output", **({"KmsKeyId": stack.kms_key_arn} if stack.kms_key_arn else {})}


def eval_metrics(names: tuple[str, ...]) -> list[tuple[str, str]]:
    """Evaluation figures as metric definitions, read off the line each evaluation prints
    (`<run> eval at step 40: eval_loss=2.0412 eval_ppl=7.7002`, training/common/trainer.py)."""
    return [(name, rf"eval at step \d+: .*\b{re.escape(name)}=([0-9.eE+-]+)") for name in names]


def metric_definitions(job: Job) -> list[dict]:
    if job.run.workload != "recipe":
        return []
    family = family_of(get_model(job.model.name).family)
    evaluated = eval_metrics(family.eval_metrics) if evaluates(job) else []
    found = [LOSS_METRIC, rate_metric(family.throughput), *evaluated]
    return [{"Name": name, "Regex": regex} for name, regex in found]


def channels(job: Job, stack: SageMakerStack, name: str) -> list[dict]:
    def channel(channel_name: str, uri: str, mode: str) -> dict:
        source = {"S3DataType": "S3Prefix", "S3Uri": uri, "S3DataDistributionType": "FullyReplicated"}
        return {"ChannelName": channel_name, "DataSource": {"S3DataSource": source}, "InputMode": mode}

    found = [channel(LAUNCH_CHANNEL, launch_prefix(stack, job.run.run_id, name), "File")]
    for channel_name, data in s3_data(job).items():
        found.append(channel(channel_name, data, "FastFile"))
    return found


def s3_data(job: Job) -> dict[str, str]:
    """{channel: s3:// URL} of what SageMaker mounts for the recipe: --data, --eval-data and pretrained --weights,
    each its own channel (the hosts read each where SageMaker mounted it: training/spec/run_folder.py)."""
    if job.run.workload != "recipe":
        return {}
    weights = (job.model.weights or "") if job.model.init == "pretrained" else ""
    found = {DATA_CHANNEL: job.data.dataset, EVAL_CHANNEL: job.evaluation.data or "", WEIGHTS_CHANNEL: weights}
    return {name: url for name, url in found.items() if url.startswith("s3://")}


def stopping_condition(job: Job) -> dict:
    runtime = job.placement.max_runtime or DEFAULT_MAX_RUNTIME_S
    condition = {"MaxRuntimeInSeconds": runtime}
    if job.placement.spot:
        condition["MaxWaitTimeInSeconds"] = job.placement.max_wait or SPOT_WAIT_FACTOR * runtime
    return condition


def render(job: Job, workload: Workload, stack: SageMakerStack, name: str, region: str | None = None) -> dict:
    """The CreateTrainingJob request: everything in it may be shown to anyone who can describe the job. `region`:
    the job's, which its hosts' AWS clients use (REGION_ENV)."""
    run_id, p = job.run.run_id, job.parallelism
    prefix = run_prefix(stack, run_id)
    environment = {
        **TORCH_ENV,
        "TRAINKIT_LAUNCH_CHANNEL": LAUNCH_CHANNEL,
        CHECKPOINT_S3_ENV: checkpoint_prefix(stack, run_id),  # where a host finds the others' parts (restore.py)
    }
    if region:  # a SageMaker container's environment is not documented to carry one; boto3 needs it (S3 restores)
        environment[REGION_ENV] = region
    for credential in job_credentials(job, workload):
        if arn := stack.secret_arn(credential):
            environment[credential.arn_env] = arn  # the secret's name, not its value
    algorithm = {
        "TrainingImage": job.placement.image,
        "TrainingInputMode": "File",
        "ContainerEntrypoint": list(ENTRY),
        "EnableSageMakerMetricsTimeSeries": True,
    }
    metrics = metric_definitions(job)
    if metrics:
        algorithm["MetricDefinitions"] = metrics
    return {
        "TrainingJobName": name,
        "AlgorithmSpecification": algorithm,
        "RoleArn": stack.role_arn,
        "InputDataConfig": channels(job, stack, name),
        "OutputDataConfig": output_config(stack, prefix),
        "ResourceConfig": {
            "InstanceType": INSTANCE_PREFIX + str(job.placement.instance_type),
            "InstanceCount": p.nodes,
            "VolumeSizeInGB": volume_gb(job),
            **volume_encryption(str(job.placement.instance_type), stack),
        },
        "VpcConfig": {"SecurityGroupIds": list(stack.security_group_ids), "Subnets": list(stack.subnets)},
        "EnableInterContainerTrafficEncryption": stack.inter_container_traffic_encryption,
        "StoppingCondition": stopping_condition(job),
        "EnableManagedSpotTraining": bool(job.placement.spot),
        "CheckpointConfig": {"S3Uri": checkpoint_prefix(stack, run_id), "LocalPath": CHECKPOINTS},
        "Environment": environment,
        "Tags": [
            {"Key": TAG_RUN, "Value": run_id},
            {"Key": TAG_MODEL, "Value": workload.label[:256]},
            *([{"Key": STACK_TAG, "Value": stack.stack_id}] if stack.stack_id else []),
        ],
    }
