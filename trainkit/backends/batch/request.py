"""A job as the two requests AWS Batch takes (API 2016-08-10; the tests validate both against botocore's service
model, tests/helpers/aws_model.py): RegisterJobDefinition, one multi-node parallel (MNP) definition per job shape,
and SubmitJob, one per submission of a run.

What goes where, and why (AWS Batch User Guide pages named in brackets):

- The job definition is the shape: `type: multinode`, `nodeProperties` with `numNodes`, main node 0 and one node
  range `0:` whose container runs the entry point (trainkit/backends/batch/node.py) on `instanceType`, with the
  instance's vCPUs, most of its memory and a GPU per process as `resourceRequirements`, its EFA devices under
  `linuxParameters.devices` (/dev/infiniband/uverbs0 .. N-1, READ/WRITE/MKNOD: ["Elastic Fabric Adapter"]),
  shared memory, an unlimited `memlock` ulimit (EFA pins memory), the FSx mount of the hosts as a volume, the
  Hugging Face token and an MLflow server's token as `secrets` entries (the secrets' ARNs; ECS puts the values into
  the container's environment, no request carries them), and the logs through `awslogs` into the stack's log group
  ["Use the awslogs log driver"]. Its name carries a hash of its content, so a shape is registered once and reused
  while it is ACTIVE.
- The retry strategy: attempts = --max-restarts + 1 (at most 10, ["Automated job retries"]); each attempt runs every
  node afresh and resumes from the run's checkpoint on FSx. evaluateOnExit, first match wins: the host went away
  ("Host EC2*", a reclaimed or failed instance) or the main node exited EXIT_REPLACE (a peer lost, a failure a new
  attempt may mend: trainkit/backends/batch/node.py) -> RETRY; EXIT_NO_RETRY (3, a failure every attempt repeats)
  or 2 (the job cannot start) -> EXIT; anything else -> EXIT (without a final entry Batch would retry it).
- The timeout: --max-runtime is each attempt's `attemptDurationSeconds` (at least 60 s; for an MNP job it covers the
  whole job, not a node; a timed-out attempt is not retried ["Job timeouts"]): the job runs at most attempts x
  timeout, plus the time each attempt waits RUNNABLE for its instances.
- The run's spec, its workload and a script's code travel in SubmitJob's `nodeOverrides` as environment values
  (the EKS pods get the same two values). They hold no secret; DescribeJobs shows them to anyone who may describe
  the job, and Batch takes at most 30 KiB in one SubmitJob ["AWS Batch service quotas"], so a script's folder must
  fit, compressed, in what the spec leaves. The stack records no bucket for Batch, and the launcher cannot write
  the FSx volume the nodes share, so the request is the one channel from this machine to the nodes.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import tarfile
from pathlib import Path

from training.common.failure import EXIT_NO_RETRY
from training.spec import Job
from trainkit import hardware
from trainkit.backends.batch.stack import BatchStack
from trainkit.backends.eks.cluster import JOB_UID
from trainkit.backends.eks.render import NCCL_EFA_ENV
from trainkit.errors import SpecError
from trainkit.infra.outputs import STACK_TAG
from trainkit.run.code import read_code
from trainkit.run.node import EXIT_CANNOT_START, EXIT_REPLACE
from trainkit.run.torchrun import TORCH_ENV
from trainkit.run.workload import WORKLOAD_ENV, Workload

ENTRY = ("python3", "-m", "trainkit.backends.batch.node")
"""The container's command on every node."""
SPEC_ENV = "TRAINKIT_SPEC"
CODE_ENV = "TRAINKIT_CODE"
"""A script's folder as a base64 gzipped tar (node.py unpacks it where the node keeps it)."""
FSX_MOUNT_ENV = "TRAINKIT_FSX_MOUNT"
"""Where the containers see the FSx volume; node.py works there, so `runs/<run-id>` is on FSx."""
MAX_ATTEMPTS = 10
MIN_TIMEOUT_S = 60
SUBMIT_LIMIT_BYTES = 30 * 1024
DEFINITION_LIMIT_BYTES = 24 * 1024
MEMORY_SHARE = 0.9
"""Of the instance's memory, what the container reserves: the ECS agent registers less than the instance has
(kernel, platform) and a job that asks for more than any instance registered is never placed; AWS recommends
keeping 5% for the agent and the system ["Compute resource memory management", "Reserve system memory"]."""
SHARED_MEMORY_SHARE = 0.5
"""/dev/shm as a share of the container's memory: what a tmpfs without a size gets (tmpfs(5)), as the EKS pods'
memory-backed volume; NCCL and data loader workers exchange data through it."""
HOST_MEMORY_GIB = {name: instance.memory_gib for name, instance in hardware.INSTANCE_TYPES.items()}
"""Host memory of the instance table's types (trainkit/tables/instance_types.json, with their vCPUs)."""
EFA_DEVICE = "/dev/infiniband/uverbs{index}"
NAME_LIMIT = 128
TAG_RUN = "trainkit:run-id"
TAG_MODEL = "trainkit:model"
FSX_VOLUME = "fsx"


def instance_host(instance_type: str) -> tuple[int, int]:
    """(vCPUs, memory in MiB) of an instance type of the table."""
    instance = hardware.INSTANCE_TYPES[instance_type]
    return instance.vcpus, instance.memory_gib * 1024


def slug(text: str) -> str:
    """A name Batch takes: letters, digits, '-' and '_', starting with a letter or digit."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-_")


def job_name(run_id: str, stamp: str) -> str:
    """Every submission of a run gets its own name: the run id as Batch allows it, then a UTC stamp."""
    return f"{slug(run_id)[: NAME_LIMIT - len(stamp) - 1].rstrip('-_')}-{stamp}"


def attempts(job: Job, workload: Workload) -> int:
    """A workload that must not be retried (the collective sweep) gets one attempt; others --max-restarts + 1."""
    return min(MAX_ATTEMPTS, job.elastic.max_restarts + 1) if workload.restarts else 1


def retry_strategy(job: Job, workload: Workload) -> dict:
    count = attempts(job, workload)
    if count == 1:
        return {"attempts": 1}
    return {
        "attempts": count,
        "evaluateOnExit": [
            {"onStatusReason": "Host EC2*", "action": "RETRY"},
            {"onExitCode": str(EXIT_REPLACE), "action": "RETRY"},
            {"onExitCode": str(EXIT_NO_RETRY), "action": "EXIT"},
            {"onExitCode": str(EXIT_CANNOT_START), "action": "EXIT"},
            {"onReason": "*", "action": "EXIT"},
        ],
    }


def efa_devices(count: int) -> list[dict]:
    return [
        {
            "hostPath": EFA_DEVICE.format(index=i),
            "containerPath": EFA_DEVICE.format(index=i),
            "permissions": ["READ", "WRITE", "MKNOD"],
        }
        for i in range(count)
    ]


def container(job: Job, stack: BatchStack, secrets: dict[str, str]) -> dict:
    """The container every node runs (ContainerProperties of the node range); `secrets`: each variable its credential
    is read into, and the ARN of the secret holding it."""
    instance = hardware.INSTANCE_TYPES[str(job.placement.instance_type)]
    vcpus, memory_mib = instance_host(instance.name)
    memory = int(memory_mib * MEMORY_SHARE)
    fabric = NCCL_EFA_ENV if instance.efa_interfaces else {}
    environment = {**TORCH_ENV, **fabric, FSX_MOUNT_ENV: stack.fsx_mount_path}
    body = {
        "image": job.placement.image,
        "command": list(ENTRY),
        # The jobs' user, not root (Docker's --user, uid:gid): FSx squashes root, and its root folder is this user's
        # (trainkit/backends/eks/fsx.py). Batch has no per-run mount: the host's /fsx is one volume, all of it.
        "user": f"{JOB_UID}:{JOB_UID}",
        "jobRoleArn": stack.job_role_arn,
        "executionRoleArn": stack.execution_role_arn,
        "instanceType": instance.name,
        "resourceRequirements": [
            {"type": "VCPU", "value": str(vcpus)},
            {"type": "MEMORY", "value": str(memory)},
            {"type": "GPU", "value": str(job.parallelism.nproc)},
        ],
        "environment": [{"name": name, "value": value} for name, value in sorted(environment.items())],
        "linuxParameters": {
            "devices": efa_devices(instance.efa_interfaces),
            "sharedMemorySize": int(memory * SHARED_MEMORY_SHARE),
        },
        "ulimits": [{"name": "memlock", "softLimit": -1, "hardLimit": -1}],
        "volumes": [{"name": FSX_VOLUME, "host": {"sourcePath": stack.fsx_mount_path}}],
        "mountPoints": [{"sourceVolume": FSX_VOLUME, "containerPath": stack.fsx_mount_path, "readOnly": False}],
        # the group exists once a job wrote to it; the execution role may create it (terraform/modules/batch)
        "logConfiguration": {
            "logDriver": "awslogs",
            "options": {"awslogs-group": stack.log_group, "awslogs-create-group": "true"},
        },
    }
    if secrets:  # the secrets' ARNs, never their values
        body["secrets"] = [{"name": name, "valueFrom": arn} for name, arn in sorted(secrets.items())]
    return body


def definition_name(job: Job, body: dict) -> str:
    """trainkit-<instance>-<nodes>x<processes>-<hash of the definition>: one registration per shape."""
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:10]
    shape = f"{job.placement.instance_type}-{job.parallelism.nodes}x{job.parallelism.nproc}"
    return f"trainkit-{slug(shape)}-{digest}"


def register_request(job: Job, workload: Workload, stack: BatchStack, secrets: dict[str, str]) -> dict:
    """The RegisterJobDefinition request of the job's shape."""
    body: dict = {
        "type": "multinode",
        "platformCapabilities": ["EC2"],
        "nodeProperties": {
            "numNodes": job.parallelism.nodes,
            "mainNode": 0,
            "nodeRangeProperties": [{"targetNodes": "0:", "container": container(job, stack, secrets)}],
        },
        "retryStrategy": retry_strategy(job, workload),
        "propagateTags": True,
    }
    if job.placement.max_runtime is not None:
        body["timeout"] = {"attemptDurationSeconds": job.placement.max_runtime}
    if stack.stack_id:
        body["tags"] = {STACK_TAG: stack.stack_id}
    return {"jobDefinitionName": definition_name(job, body), **body}


def pack_code(folder: Path, runs_dir: str | None = None) -> str:
    """A script's folder (what travels with any job, trainkit/run/code.py) as one value: gzipped tar, base64."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as archive:
        for name, data in sorted(read_code(folder, runs_dir).items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode()


def unpack_code(value: str, into: Path) -> Path:
    """The folder `pack_code` packed, written under `into` (names stay inside it)."""
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(value)), mode="r:gz") as archive:
        archive.extractall(into, filter="data")
    return into


def launch_environment(job: Job, workload: Workload) -> list[dict]:
    """What this submission's nodes start from: the spec, the workload and a script's code."""
    values = {SPEC_ENV: json.dumps(job.to_dict(), sort_keys=True), WORKLOAD_ENV: workload.to_json()}
    if workload.code is not None:
        values[CODE_ENV] = pack_code(Path(workload.code), job.run.runs_dir)
    return [{"name": name, "value": value} for name, value in values.items()]


def submit_request(job: Job, workload: Workload, stack: BatchStack, name: str, definition: str) -> dict:
    """The SubmitJob request: the definition of the job's shape, this run's launch values for every node."""
    tags = {TAG_RUN: job.run.run_id, TAG_MODEL: workload.label[:256]}
    if stack.stack_id:
        tags[STACK_TAG] = stack.stack_id
    overrides = {"targetNodes": "0:", "containerOverrides": {"environment": launch_environment(job, workload)}}
    return {
        "jobName": name,
        "jobQueue": stack.job_queue_arn,
        "jobDefinition": definition,
        "nodeOverrides": {"nodePropertyOverrides": [overrides]},
        "propagateTags": True,
        "tags": tags,
    }


def check_sizes(register: dict, submit: dict) -> None:
    """Batch's limits on the two requests ["AWS Batch service quotas"]: a script's folder that does not fit is
    refused here, naming what to do."""
    for what, body, limit in (
        ("RegisterJobDefinition", register, DEFINITION_LIMIT_BYTES),
        ("SubmitJob", submit, SUBMIT_LIMIT_BYTES),
    ):
        size = len(json.dumps(body).encode())
        if size > limit:
            raise SpecError(
                f"the {what} request is {size // 1024} KiB and AWS Batch takes at most {limit // 1024} KiB: a script's "
                "folder travels in it, compressed; move the script and the modules it imports into a folder of their "
                "own, or build them into an image (FROM trainkit's training image) and pass --image"
            )
