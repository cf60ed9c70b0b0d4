"""`infra.audit` and SageMaker training jobs (trainkit/infra/aws.py): a job the stack's tag marks is listed while
it bills (InProgress, Stopping) and left out once it has ended, since ended jobs stay in the account for good. On
moto's in-process emulator, whose CreateTrainingJob ends a job at once (Completed)."""

from __future__ import annotations

import pytest
from moto import mock_aws

from trainkit.infra import aws
from trainkit.infra.outputs import STACK_TAG

JOB = {
    "TrainingJobName": "llama2-tiny-abc-20261125-000000",
    "AlgorithmSpecification": {
        "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
        "TrainingInputMode": "File",
    },
    "RoleArn": "arn:aws:iam::123456789012:role/trainkit-sagemaker",
    "OutputDataConfig": {"S3OutputPath": "s3://trainkit-runs/runs/x/output"},
    "ResourceConfig": {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2, "VolumeSizeInGB": 100},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    "Tags": [{"Key": STACK_TAG, "Value": "trainkit-audit"}],
}


@pytest.fixture
def emulated(monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        import boto3

        boto3.session.Session(region_name="us-east-1").client("sagemaker").create_training_job(**JOB)
        yield


def test_an_ended_training_job_is_not_left_over(emulated):
    left = aws.audit("trainkit-audit", "us-east-1", "trainkit")
    assert not [item for item in left if "training-job" in item], left


def test_a_training_job_that_bills_is_listed(emulated, monkeypatch):
    monkeypatch.setattr(aws, "RUNNING_TRAINING", ("Completed",))  # moto's jobs end at once: count that as running
    left = aws.audit("trainkit-audit", "us-east-1", "trainkit")
    assert f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{JOB['TrainingJobName']}" in left
