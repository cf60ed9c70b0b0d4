"""An account for `--target sagemaker` in moto's server, run in this process (moto.server.ThreadedMotoServer) so the
parts moto leaves out can be added to it here, while trainkit's commands reach it over HTTP from their own
processes (AWS_ENDPOINT_URL, which boto3 honours for every service).

What it holds: the SageMaker part of the infra stack as terraform/modules/sagemaker makes it (execution role, runs
bucket, the Hugging Face token secret), the training image in ECR with trainkit's label (tests/helpers/ecr_blobs.py
serves its blobs), and the stack's outputs recorded as `make up` records them.

What is added to moto, each from the service's own reference:
- Service Quotas for SageMaker (moto 5.2 knows only VPC's): ListAWSDefaultServiceQuotas lists each quota's code,
  name and default; GetServiceQuota answers an account's applied value, or NoSuchResourceException for a quota the
  account never had applied (Service Quotas API reference, GetServiceQuota: "If the applied quota value is not
  available for a quota, the quota is not retrieved"). Quota names as SageMaker's limit errors name them,
  "<instance type> for training job usage" and "... for spot training job usage"; the codes are this stand-in's.
- StopTrainingJob (moto has none): a job InProgress moves to Stopping, and a job in any other state is refused
  with ValidationException (SageMaker API reference, StopTrainingJob: "Stops a training job ... sends the algorithm
  the SIGTERM signal"); here nothing runs, so Stopping becomes Stopped when the next describe looks.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.aws import FAKE_AWS
from tests.helpers.ecr_blobs import EcrBlobs
from trainkit.infra.outputs import save_outputs

ACCOUNT, REGION = "123456789012", "us-east-1"
STACK_ID = "trainkit-sagemaker-test"
INSTANCES = ("ml.p5.48xlarge", "ml.p4d.24xlarge")


@dataclass
class Account:
    endpoint: str
    env: dict
    stack: dict
    image: str
    quotas: dict = field(default_factory=dict)  # quota name -> applied value (absent: the default, 0)
    runners: dict = field(default_factory=dict)  # job name -> the stand-in's run of it (run_jobs)

    def wait(self, name: str, timeout: float = 600) -> dict:
        """DescribeTrainingJob once the job has ended (Completed, Failed, Stopped)."""
        deadline = time.monotonic() + timeout
        while True:
            described = self.client("sagemaker").describe_training_job(TrainingJobName=name)
            if described["TrainingJobStatus"] in ("Completed", "Failed", "Stopped"):
                return described
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} still {described['TrainingJobStatus']} after {timeout:.0f} s")
            time.sleep(0.5)

    def client(self, service: str):
        import boto3

        return boto3.client(service, region_name=REGION, endpoint_url=self.endpoint, **_keys())

    def job_status(self, name: str, status: str) -> None:
        """Set a job's status, as the service moves it (moto's jobs are Completed at once)."""
        from moto.sagemaker.models import sagemaker_backends

        job = sagemaker_backends[ACCOUNT][REGION].training_jobs[name]
        job.training_job_status = job.secondary_status = status


def _keys() -> dict:
    return {
        "aws_access_key_id": FAKE_AWS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": FAKE_AWS["AWS_SECRET_ACCESS_KEY"],
    }


def _default_quotas() -> list[dict]:
    found = []
    for index, instance in enumerate(INSTANCES):
        for kind, offset in (("training job usage", 0), ("spot training job usage", 1)):
            found.append(
                {
                    "ServiceCode": "sagemaker",
                    "ServiceName": "Amazon SageMaker",
                    "QuotaCode": f"L-STANDIN{2 * index + offset:02d}",
                    "QuotaName": f"{instance} for {kind}",
                    "Value": 0.0,
                    "Unit": "None",
                    "Adjustable": True,
                    "GlobalQuota": False,
                }
            )
    return found


@contextlib.contextmanager
def patched_moto(account_quotas: dict, run_jobs: dict | None = None, runners: dict | None = None) -> Iterator[None]:
    from moto.sagemaker.models import sagemaker_backends
    from moto.sagemaker.responses import SageMakerResponse
    from moto.servicequotas.exceptions import NoSuchResource
    from moto.servicequotas.models import ServiceQuotasBackend

    defaults = _default_quotas()
    list_defaults, get_quota = (
        ServiceQuotasBackend.list_aws_default_service_quotas,
        ServiceQuotasBackend.get_service_quota,
    )

    def list_aws_default_service_quotas(self, service_code):
        return defaults if service_code == "sagemaker" else list_defaults(self, service_code)

    def get_service_quota(self, service_code, quota_code):
        if service_code != "sagemaker":
            return get_quota(self, service_code, quota_code)
        quota = next((q for q in defaults if q["QuotaCode"] == quota_code), None)
        if quota is None or quota["QuotaName"] not in account_quotas:
            raise NoSuchResource()
        return {**quota, "Value": float(account_quotas[quota["QuotaName"]])}

    def stop_training_job(self):
        from moto.core.responses import ActionResult
        from moto.sagemaker.exceptions import ValidationError

        name = self._get_param("TrainingJobName")
        job = sagemaker_backends[self.current_account][self.region].training_jobs.get(name)
        if job is None or job.training_job_status != "InProgress":
            state = job.training_job_status if job else "unknown"
            raise ValidationError(message=f"The request was rejected because the training job is in status {state}.")
        if name in runners:
            runners[name].stop()
        else:
            job.training_job_status, job.secondary_status = "Stopping", "Stopping"
        return ActionResult({})

    create = SageMakerResponse.create_training_job

    def create_training_job(self):
        result = create(self)
        if run_jobs is not None:  # the stand-in runs it (tests/helpers/sagemaker_standin.py)
            from tests.helpers.sagemaker_standin import Job

            name = self._get_param("TrainingJobName")
            fake = sagemaker_backends[self.current_account][self.region].training_jobs[name]
            job = Job(fake, json.loads(self.body), run_jobs["folder"], run_jobs["clients"])
            runners[name] = job
            threading.Thread(target=job.run, name=f"sagemaker-{name}", daemon=True).start()
        return result

    ServiceQuotasBackend.list_aws_default_service_quotas = list_aws_default_service_quotas
    ServiceQuotasBackend.get_service_quota = get_service_quota
    runners = {} if runners is None else runners
    SageMakerResponse.stop_training_job = stop_training_job
    SageMakerResponse.create_training_job = create_training_job
    try:
        yield
    finally:
        SageMakerResponse.create_training_job = create
        for job in runners.values():
            job.kill()
        ServiceQuotasBackend.list_aws_default_service_quotas = list_defaults
        ServiceQuotasBackend.get_service_quota = get_quota
        del SageMakerResponse.stop_training_job


def _reset(endpoint: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30).read()


@contextlib.contextmanager
def sagemaker_account(folder: Path, quotas: dict | None = None, run_jobs: bool = False) -> Iterator[Account]:
    """The account, with the stack's outputs recorded in this test's state folder (TRAINKIT_STATE_DIR); the
    commands reach it with `account.env`. `quotas`: applied quota values by name (the rest stay at 0).
    `run_jobs`: a created job runs on the stand-in (tests/helpers/sagemaker_standin.py) instead of ending at once."""
    import boto3
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    from trainkit.backends.eks.image import POD_ENTRY_LABEL, POD_ENTRY_MODULE

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    applied = dict(quotas or {})
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    endpoint = f"http://127.0.0.1:{port}"

    def client(service: str):
        return boto3.client(service, region_name=REGION, endpoint_url=endpoint, **_keys())

    runners: dict = {}
    jobs = {"folder": folder / "jobs", "clients": client} if run_jobs else None
    with patched_moto(applied, jobs, runners), EcrBlobs(folder / "blobs") as blobs:
        server.start()
        try:
            _reset(endpoint)  # moto's backends live in this process: start from an empty account
            session = {"region_name": REGION, "endpoint_url": endpoint, **_keys()}
            iam = boto3.client("iam", **session)
            role = iam.create_role(RoleName="trainkit-sagemaker", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
            bucket = f"trainkit-runs-{ACCOUNT}"
            boto3.client("s3", **session).create_bucket(Bucket=bucket)
            secret = boto3.client("secretsmanager", **session).create_secret(Name="trainkit-hf-token")["ARN"]
            ecr = boto3.client("ecr", **session)
            url = ecr.create_repository(repositoryName="trainkit/train")["repository"]["repositoryUri"]
            blobs.push(ecr, "trainkit/train", "v1", {POD_ENTRY_LABEL: POD_ENTRY_MODULE})
            stack = {
                "role_arn": role,
                "bucket": bucket,
                "subnet_ids": ["subnet-0a1b2c3d4e5f60718"],
                "security_group_ids": ["sg-0a1b2c3d4e5f60718"],
                "hf_token_secret_arn": secret,
            }
            save_outputs(
                {"gpu_instance_type": "p5.48xlarge", "region": REGION, "stack_id": STACK_ID, "sagemaker": stack}
            )
            yield Account(endpoint, {**FAKE_AWS, "AWS_ENDPOINT_URL": endpoint}, stack, f"{url}:v1", applied, runners)
        finally:
            _reset(endpoint)
            server.stop()
