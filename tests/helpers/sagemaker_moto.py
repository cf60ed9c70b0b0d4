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
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.aws import (
    ACCOUNT,
    REGION,
    MotoAccount,
    ThreadedMoto,
    default_quota,
    patched_quotas,
    push_image_and_save,
)
from tests.helpers.ecr_blobs import EcrBlobs

STACK_ID = "trainkit-sagemaker-test"
INSTANCES = ("ml.p5.48xlarge", "ml.p4d.24xlarge")


@dataclass
class Account(MotoAccount):
    quotas: dict = field(default_factory=dict)  # quota name -> applied value (absent: the default, 0)
    runners: dict = field(default_factory=dict)  # job name -> the stand-in's run of it (run_jobs)
    run_env: dict = field(default_factory=dict)  # run id -> variables a test adds to its jobs' hosts (run_jobs)

    def wait(self, name: str, timeout: float = 600) -> dict:
        """DescribeTrainingJob once the job has ended (Completed, Failed, Stopped)."""

        def describe() -> dict:
            return self.client("sagemaker").describe_training_job(TrainingJobName=name)

        return self.poll(describe, "TrainingJobStatus", ("Completed", "Failed", "Stopped"), name, timeout)

    def job_status(self, name: str, status: str) -> None:
        """Set a job's status, as the service moves it (moto's jobs are Completed at once)."""
        from moto.sagemaker.models import sagemaker_backends

        job = sagemaker_backends[ACCOUNT][REGION].training_jobs[name]
        job.training_job_status = job.secondary_status = status


def _default_quotas() -> list[dict]:
    found = []
    for index, instance in enumerate(INSTANCES):
        for kind, offset in (("training job usage", 0), ("spot training job usage", 1)):
            code = f"L-STANDIN{2 * index + offset:02d}"
            found.append(default_quota("sagemaker", "Amazon SageMaker", code, f"{instance} for {kind}"))
    return found


@contextlib.contextmanager
def patched_moto(account_quotas: dict, run_jobs: dict | None = None, runners: dict | None = None) -> Iterator[None]:
    from moto.sagemaker.models import sagemaker_backends
    from moto.sagemaker.responses import SageMakerResponse

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
            job = Job(fake, json.loads(self.body), run_jobs["folder"], run_jobs["clients"], run_jobs["run_env"])
            runners[name] = job
            threading.Thread(target=job.run, name=f"sagemaker-{name}", daemon=True).start()
        return result

    runners = {} if runners is None else runners
    with patched_quotas("sagemaker", _default_quotas(), account_quotas, "QuotaName"):
        SageMakerResponse.stop_training_job = stop_training_job
        SageMakerResponse.create_training_job = create_training_job
        try:
            yield
        finally:
            SageMakerResponse.create_training_job = create
            for job in runners.values():
                job.kill()
            del SageMakerResponse.stop_training_job


@contextlib.contextmanager
def sagemaker_account(folder: Path, quotas: dict | None = None, run_jobs: bool = False) -> Iterator[Account]:
    """The account, with the stack's outputs recorded in this test's state folder (TRAINKIT_STATE_DIR); the
    commands reach it with `account.env`. `quotas`: applied quota values by name (the rest stay at 0).
    `run_jobs`: a created job runs on the stand-in (tests/helpers/sagemaker_standin.py) instead of ending at once."""
    applied = dict(quotas or {})
    moto = ThreadedMoto()
    runners: dict = {}
    run_env: dict = {}
    jobs = {"folder": folder / "jobs", "clients": moto.client, "run_env": run_env} if run_jobs else None
    with patched_moto(applied, jobs, runners), EcrBlobs(folder / "blobs") as blobs, moto:
        role = moto.client("iam").create_role(RoleName="trainkit-sagemaker", AssumeRolePolicyDocument="{}")
        bucket = f"trainkit-runs-{ACCOUNT}"
        moto.client("s3").create_bucket(Bucket=bucket)
        secret = moto.client("secretsmanager").create_secret(Name="trainkit-hf-token")["ARN"]  # empty, as Terraform's
        mlflow_secret = moto.client("secretsmanager").create_secret(Name="trainkit-mlflow-token")["ARN"]
        stack = {
            "role_arn": role["Role"]["Arn"],
            "bucket": bucket,
            "subnet_ids": ["subnet-0a1b2c3d4e5f60718"],
            "security_group_ids": ["sg-0a1b2c3d4e5f60718"],
            "hf_token_secret_arn": secret,
            "mlflow_token_secret_arn": mlflow_secret,
        }
        image = push_image_and_save(moto, blobs, STACK_ID, {"sagemaker": stack})
        yield Account(moto.endpoint, moto.env, stack, image, applied, runners, run_env)
