"""An account for `--target batch` in moto's server, run in this process (moto.server.ThreadedMotoServer) so the parts
moto leaves out can be added to it here, while trainkit's commands reach it over HTTP from their own processes
(AWS_ENDPOINT_URL, which boto3 honours for every service).

What it holds: the Batch part of the infra stack as terraform/modules/batch makes it (a MANAGED compute environment
of EC2 on-demand p5 instances, its job queue, the job and execution roles, the Hugging Face token's empty secret, the
log group), the training image in ECR with trainkit's label (tests/helpers/ecr_blobs.py serves its blobs), and the
stack's outputs recorded as `make up` records them (the `batch` output's keys).

moto keeps the compute environments, queues and job definitions (RegisterJobDefinition, DescribeJobDefinitions).
Its jobs are not Batch's: without Docker they end at once, and it has no node jobs, retry strategy, attempts or
node overrides. So SubmitJob, DescribeJobs, ListJobs and TerminateJob are the stand-in's
(tests/helpers/batch_standin.py), which runs the nodes (`run_jobs`) or leaves a job RUNNABLE, as a queue without
capacity does. Service Quotas for EC2 are added too (moto 5.2 knows only VPC's): ListAWSDefaultServiceQuotas lists
"Running On-Demand P instances" (L-417A185B, vCPUs, default 0), and GetServiceQuota answers an account's applied
value or NoSuchResourceException for a quota never applied (Service Quotas API reference, GetServiceQuota).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.aws import (
    MotoAccount,
    ThreadedMoto,
    default_quota,
    patched_quotas,
    push_image_and_save,
)
from tests.helpers.ecr_blobs import EcrBlobs

STACK_ID = "trainkit-batch-test"
P_QUOTA = {"code": "L-417A185B", "name": "Running On-Demand P instances"}
LOG_GROUP = "/aws/batch/job"
FSX_MOUNT = "/fsx"


@dataclass
class Account(MotoAccount):
    service: object  # tests/helpers/batch_standin.py: Service
    quotas: dict = field(default_factory=dict)  # quota code -> applied vCPUs (absent: the default, 0)

    def wait(self, job_id: str, timeout: float = 600) -> dict:
        """DescribeJobs once the job has ended (SUCCEEDED or FAILED)."""

        def describe() -> dict:
            (described,) = self.client("batch").describe_jobs(jobs=[job_id])["jobs"]
            return described

        return self.poll(describe, "status", ("SUCCEEDED", "FAILED"), job_id, timeout)


@contextlib.contextmanager
def patched_moto(applied: dict, service) -> Iterator[None]:
    from moto.batch.responses import BatchResponse

    ec2 = default_quota("ec2", "Amazon Elastic Compute Cloud (Amazon EC2)", P_QUOTA["code"], P_QUOTA["name"])

    def submitjob(self):
        return json.dumps(service.submit(json.loads(self.body), self.current_account, self.region))

    def describejobs(self):
        return json.dumps({"jobs": service.describe(self._get_param("jobs") or [])})

    def listjobs(self):
        found = service.list(self._get_param("jobQueue"), self._get_param("jobStatus"), self._get_param("filters"))
        return json.dumps({"jobSummaryList": found})

    def terminatejob(self):
        service.terminate(self._get_param("jobId"), self._get_param("reason"))
        return ""

    replaced = ("submitjob", "describejobs", "listjobs", "terminatejob")
    originals = {name: getattr(BatchResponse, name) for name in replaced}
    with patched_quotas("ec2", [ec2], applied, "QuotaCode"):
        for name, method in (
            ("submitjob", submitjob),
            ("describejobs", describejobs),
            ("listjobs", listjobs),
            ("terminatejob", terminatejob),
        ):
            setattr(BatchResponse, name, method)
        try:
            yield
        finally:
            service.close()
            for name, method in originals.items():
                setattr(BatchResponse, name, method)


def _stack(session: dict, max_nodes: int, capacity: str, instance_types: list[str]) -> dict:
    """The stack's Batch part, as terraform/modules/batch makes it, and its `batch` output."""
    import boto3

    iam, ec2, batch = (boto3.client(name, **session) for name in ("iam", "ec2", "batch"))
    role = {}
    for name in ("batch-service", "batch-job", "batch-execution", "batch-instance"):
        role[name] = iam.create_role(RoleName=f"trainkit-{name}", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    profile = iam.create_instance_profile(InstanceProfileName="trainkit-batch-instance")["InstanceProfile"]["Arn"]
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="trainkit-batch", Description="EFA", VpcId=vpc)["GroupId"]
    environment = batch.create_compute_environment(
        computeEnvironmentName="trainkit-batch",
        type="MANAGED",
        state="ENABLED",
        serviceRole=role["batch-service"],
        computeResources={
            "type": capacity,
            "minvCpus": 0,
            "maxvCpus": 192 * max_nodes,
            "instanceTypes": instance_types,
            "subnets": [subnet],
            "securityGroupIds": [group],
            "instanceRole": profile,
        },
    )["computeEnvironmentArn"]
    queue = batch.create_job_queue(
        jobQueueName="trainkit-batch",
        state="ENABLED",
        priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": environment}],
    )["jobQueueArn"]
    secrets = boto3.client("secretsmanager", **session)
    secret = secrets.create_secret(Name="trainkit-batch-hf-token")["ARN"]  # empty, as Terraform makes them
    mlflow_secret = secrets.create_secret(Name="trainkit-batch-mlflow-token")["ARN"]
    boto3.client("logs", **session).create_log_group(logGroupName=LOG_GROUP)
    return {
        "job_queue_arn": queue,
        "job_queue_name": "trainkit-batch",
        "compute_environment_arn": environment,
        "job_role_arn": role["batch-job"],
        "execution_role_arn": role["batch-execution"],
        "instance_types": instance_types,
        "fsx_mount_path": FSX_MOUNT,
        "log_group": LOG_GROUP,
        "hf_token_secret_arn": secret,
        "mlflow_token_secret_arn": mlflow_secret,
        "max_nodes": max_nodes,
    }


@contextlib.contextmanager
def batch_account(
    folder: Path,
    quotas: dict | None = None,
    run_jobs: bool = False,
    max_nodes: int = 4,
    capacity: str = "EC2",
) -> Iterator[Account]:
    """The account, with the stack's outputs recorded in this test's state folder (TRAINKIT_STATE_DIR); the commands
    reach it with `account.env`. `quotas`: applied EC2 quota values by code (the rest stay at 0). `run_jobs`: a job
    runs its nodes on the stand-in instead of waiting RUNNABLE. `capacity`: the compute environment's EC2 or SPOT."""
    from tests.helpers.batch_standin import Service

    applied = dict(quotas or {})
    moto = ThreadedMoto()
    service = Service(folder / "batch", moto.client, run_jobs)
    with patched_moto(applied, service), EcrBlobs(folder / "blobs") as blobs, moto:
        stack = _stack(moto.session, max_nodes, capacity, ["p5.48xlarge"])
        image = push_image_and_save(moto, blobs, STACK_ID, {"batch": stack})
        yield Account(moto.endpoint, moto.env, stack, image, service, applied)
