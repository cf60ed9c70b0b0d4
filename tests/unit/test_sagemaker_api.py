"""What `invoke status` says of a SageMaker job (DescribeTrainingJob as the API returns it) and which jobs are a
run's, without an AWS call: the calls themselves run against the emulated account in
tests/integration/test_sagemaker_submit.py."""

from __future__ import annotations

from datetime import UTC, datetime

from trainkit.backends.sagemaker import api, request
from trainkit.run.state import RunState


class FakeSageMaker:
    def __init__(self, described: dict):
        self.described = described

    def describe_training_job(self, TrainingJobName):  # noqa: N803 - boto3's argument name
        return self.described


def at(minute: int) -> datetime:
    return datetime(2026, 11, 26, 3, minute, tzinfo=UTC)


def test_status_shows_transitions_failure_and_what_spot_saved():
    described = {
        "TrainingJobStatus": "Failed",
        "SecondaryStatus": "Failed",
        "ResourceConfig": {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2, "VolumeSizeInGB": 100},
        "EnableManagedSpotTraining": True,
        "FailureReason": "AlgorithmError: algo-2: rank 9: no space left on device",
        "TrainingTimeInSeconds": 1000,
        "BillableTimeInSeconds": 300,
        "SecondaryStatusTransitions": [
            {"Status": "Starting", "StartTime": at(0), "EndTime": at(2), "StatusMessage": "Preparing the instances"},
            {"Status": "Training", "StartTime": at(2)},
        ],
        "CheckpointConfig": {"S3Uri": "s3://b/checkpoints/r1"},
        "FinalMetricDataList": [
            {"MetricName": "loss", "Value": 1.93421, "Timestamp": at(5)},
            {"MetricName": "eval_loss", "Value": 2.0412, "Timestamp": at(5)},
        ],
    }
    found = api.status(lambda service: FakeSageMaker(described), "r1", "r1-20261126-030000")
    lines = found.text.splitlines()
    assert found.state is RunState.FAILED
    assert lines[0] == "SageMaker job r1-20261126-030000 (run r1): failed"
    assert lines[1] == "  status Failed / Failed, 2 x ml.p5.48xlarge, managed spot"
    assert lines[2] == "  failed: AlgorithmError: algo-2: rank 9: no space left on device"
    assert lines[3] == "  training 1000 s, billable 300 s, spot saved 70%"
    assert lines[4] == "  2026-11-26 03:00:00 -> 2026-11-26 03:02:00  Starting: Preparing the instances"
    assert lines[5] == "  2026-11-26 03:02:00  Training"
    assert lines[6] == "  metrics loss 1.934, eval_loss 2.041"  # the metric definitions' last values
    assert lines[7] == "  checkpoints s3://b/checkpoints/r1"


def test_a_runs_jobs_are_its_name_a_dash_and_a_stamp():
    prefix = request.job_name("llama2-7b-abc", "")[:-1]
    assert api._of_run(request.job_name("llama2-7b-abc", "20261126-030000"), prefix)
    assert not api._of_run("llama2-7b-abc-extra-20261126-030000", prefix)  # another run's that shares the start
    assert not api._of_run("llama2-7b-abcd-20261126-030000", prefix)


def test_a_dataset_must_be_where_the_execution_role_reads():
    from dataclasses import replace

    from training.spec import Job
    from trainkit.backends.sagemaker.stack import PLACEHOLDER

    stack = replace(PLACEHOLDER, bucket="runs-bucket", data_buckets=("corpora",))
    job = Job()
    job.run.workload = "recipe"

    def problems(dataset: str) -> list[str]:
        job.data.dataset = dataset
        return api._data_problems(job, stack)

    assert problems("s3://runs-bucket/datasets/wiki/") == []  # the runs bucket's datasets/ prefix
    assert problems("s3://corpora/wiki/train.jsonl") == []  # a bucket in data_source_buckets
    assert problems("synthetic") == [] and problems("/fsx/imagenet") == []  # not S3: the backend's other checks
    (said,) = problems("s3://runs-bucket/my-data/")  # the runs bucket elsewhere: the role cannot read it
    assert "may read datasets only under s3://runs-bucket/datasets/, s3://corpora/" in said
    assert "upload it under s3://runs-bucket/datasets/" in said
    job.run.workload = "script"
    assert problems("s3://anywhere/x") == []  # a script reads what it reads; no channel is made for it
