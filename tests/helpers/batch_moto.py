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
import socket
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.aws import FAKE_AWS
from tests.helpers.ecr_blobs import EcrBlobs
from trainkit.infra.outputs import save_outputs

ACCOUNT, REGION = "123456789012", "us-east-1"
STACK_ID = "trainkit-batch-test"
P_QUOTA = {"code": "L-417A185B", "name": "Running On-Demand P instances"}
LOG_GROUP = "/aws/batch/job"
FSX_MOUNT = "/fsx"


@dataclass
class Account:
    endpoint: str
    env: dict
    stack: dict
    image: str
    service: object  # tests/helpers/batch_standin.py: Service
    quotas: dict = field(default_factory=dict)  # quota code -> applied vCPUs (absent: the default, 0)

    def client(self, service: str):
        import boto3

        return boto3.client(service, region_name=REGION, endpoint_url=self.endpoint, **_keys())

    def wait(self, job_id: str, timeout: float = 600) -> dict:
        """DescribeJobs once the job has ended (SUCCEEDED or FAILED)."""
        deadline = time.monotonic() + timeout
        while True:
            (described,) = self.client("batch").describe_jobs(jobs=[job_id])["jobs"]
            if described["status"] in ("SUCCEEDED", "FAILED"):
                return described
            if time.monotonic() > deadline:
                raise TimeoutError(f"{job_id} still {described['status']} after {timeout:.0f} s")
            time.sleep(0.5)


def _keys() -> dict:
    return {
        "aws_access_key_id": FAKE_AWS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": FAKE_AWS["AWS_SECRET_ACCESS_KEY"],
    }


@contextlib.contextmanager
def patched_moto(applied: dict, service) -> Iterator[None]:
    from moto.batch.responses import BatchResponse
    from moto.servicequotas.exceptions import NoSuchResource
    from moto.servicequotas.models import ServiceQuotasBackend

    default = {
        "ServiceCode": "ec2",
        "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
        "QuotaCode": P_QUOTA["code"],
        "QuotaName": P_QUOTA["name"],
        "Value": 0.0,
        "Unit": "None",
        "Adjustable": True,
        "GlobalQuota": False,
    }
    list_defaults = ServiceQuotasBackend.list_aws_default_service_quotas
    get_quota = ServiceQuotasBackend.get_service_quota

    def list_aws_default_service_quotas(self, service_code):
        return [default] if service_code == "ec2" else list_defaults(self, service_code)

    def get_service_quota(self, service_code, quota_code):
        if service_code != "ec2":
            return get_quota(self, service_code, quota_code)
        if quota_code != P_QUOTA["code"] or quota_code not in applied:
            raise NoSuchResource()
        return {**default, "Value": float(applied[quota_code])}

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
    ServiceQuotasBackend.list_aws_default_service_quotas = list_aws_default_service_quotas
    ServiceQuotasBackend.get_service_quota = get_service_quota
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
        ServiceQuotasBackend.list_aws_default_service_quotas = list_defaults
        ServiceQuotasBackend.get_service_quota = get_quota


def _reset(endpoint: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30).read()


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
    secret = boto3.client("secretsmanager", **session).create_secret(Name="trainkit-batch-hf-token")["ARN"]
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
    import boto3
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    from tests.helpers.batch_standin import Service
    from trainkit.backends.eks.image import POD_ENTRY_LABEL, POD_ENTRY_MODULE

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    applied = dict(quotas or {})
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    endpoint = f"http://127.0.0.1:{port}"

    def client(service_name: str):
        return boto3.client(service_name, region_name=REGION, endpoint_url=endpoint, **_keys())

    service = Service(folder / "batch", client, run_jobs)
    with patched_moto(applied, service), EcrBlobs(folder / "blobs") as blobs:
        server.start()
        try:
            _reset(endpoint)  # moto's backends live in this process: start from an empty account
            session = {"region_name": REGION, "endpoint_url": endpoint, **_keys()}
            stack = _stack(session, max_nodes, capacity, ["p5.48xlarge"])
            ecr = boto3.client("ecr", **session)
            url = ecr.create_repository(repositoryName="trainkit/train")["repository"]["repositoryUri"]
            blobs.push(ecr, "trainkit/train", "v1", {POD_ENTRY_LABEL: POD_ENTRY_MODULE})
            save_outputs({"gpu_instance_type": "p5.48xlarge", "region": REGION, "stack_id": STACK_ID, "batch": stack})
            env = {**FAKE_AWS, "AWS_ENDPOINT_URL": endpoint}
            yield Account(endpoint, env, stack, f"{url}:v1", service, applied)
        finally:
            _reset(endpoint)
            server.stop()
