"""`invoke train --target sagemaker` for real, against an account in moto's server with what moto lacks added
(tests/helpers/sagemaker_moto.py): the preflight names every problem before anything is uploaded or created, a
job that passes is uploaded and created as the dry run shows it, and `invoke status / logs / stop --run-id` find it
without `--target`. What the instances then do is the stand-in's (trainkit/backends/sagemaker/README.md)."""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers.aws_model import problems
from tests.helpers.product import invoke_in
from tests.helpers.sagemaker_moto import sagemaker_account

P5 = "ml.p5.48xlarge for training job usage"
P5_SPOT = "ml.p5.48xlarge for spot training job usage"
TOKEN = "hf_sagemakerSubmitTokenThatMustNeverBeShown"


@pytest.fixture
def account(tmp_path, monkeypatch):
    with sagemaker_account(tmp_path, quotas={P5: 4}) as found:
        for name, value in found.env.items():
            monkeypatch.setenv(name, value)
        yield found


def train(folder, account, *flags: str, model: str = "llama2-7b"):
    return invoke_in(
        folder,
        "train",
        "--model",
        model,
        "--target",
        "sagemaker",
        "--nodes",
        "2",
        "--image",
        account.image,
        *flags,
    )


def test_the_preflight_names_every_problem_before_anything_is_created(tmp_path, account):
    account.client("iam").delete_role(RoleName="trainkit-sagemaker")
    data = "s3://someone-elses-data/chat/train.jsonl"
    held = "s3://someone-elses-data/chat/held-out/"
    flags = ("--dataset", data, "--eval-data", held)
    done = train(tmp_path, account, "--spot", "--init", "pretrained", "--run-id", "pre", *flags)
    assert done.returncode == 2, done.stderr
    error = done.stderr
    bucket = account.stack["bucket"]
    assert f"--data {data}: the execution role may read datasets only under s3://{bucket}/datasets/" in error
    assert f"--eval-data {held}: the execution role may read datasets only under" in error
    assert 'or add "someone-elses-data" to data_source_buckets' in error
    assert "execution role arn:aws:iam::123456789012:role/trainkit-sagemaker: NoSuchEntity" in error
    assert "holds no value yet; `invoke secrets.hf-token --target sagemaker` stores it" in error
    assert f"the account's quota {P5_SPOT!r} is 0 instance(s) and the job needs 2" in error
    assert P5 + "'" not in error  # 4 on-demand instances allowed: that one passes
    sagemaker, s3 = account.client("sagemaker"), account.client("s3")
    assert sagemaker.list_training_jobs()["TrainingJobSummaries"] == []
    assert s3.list_objects_v2(Bucket=account.stack["bucket"]).get("KeyCount") == 0


def test_a_job_is_uploaded_created_and_found_without_target(tmp_path, account):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    stored = invoke_in(tmp_path, "secrets.hf-token", "--target", "sagemaker", "--file", str(token))
    assert stored.returncode == 0 and TOKEN not in stored.stdout + stored.stderr, stored.stderr
    done = train(tmp_path, account, "--init", "pretrained", "--run-id", "ft", "--max-runtime", "2h")
    assert done.returncode == 0, done.stderr
    assert "submitted SageMaker job ft-" in done.stdout and TOKEN not in done.stdout + done.stderr
    sagemaker = account.client("sagemaker")
    (summary,) = sagemaker.list_training_jobs()["TrainingJobSummaries"]
    name = summary["TrainingJobName"]
    described = sagemaker.describe_training_job(TrainingJobName=name)
    assert described["ResourceConfig"]["InstanceCount"] == 2
    assert described["StoppingCondition"]["MaxRuntimeInSeconds"] == 7200
    # the launch channel holds the spec and the workload the instances start from
    launch = described["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"]
    bucket, _, key = launch.removeprefix("s3://").partition("/")
    spec = json.loads(account.client("s3").get_object(Bucket=bucket, Key=key + "spec.json")["Body"].read())
    assert spec["run"]["run_id"] == "ft" and spec["parallelism"]["nproc"] == 8
    # the image is kept for the run (the repository's lifecycle rule keeps run- tags)
    tags = account.client("ecr").describe_images(repositoryName="trainkit/train")["imageDetails"][0]["imageTags"]
    assert "run-ft" in tags
    # the request as created is one the service model accepts, with no token in it
    assert TOKEN not in json.dumps(described, default=str)

    status = invoke_in(tmp_path, "status", "--run-id", "ft")
    assert status.returncode == 0, status.stderr
    assert f"SageMaker job {name} (run ft): finished\n" in status.stdout and "2 x ml.p5.48xlarge" in status.stdout
    # a run that stopped early says so: its summary.json, as the hosts synced the run folder to the checkpoint prefix
    bucket, _, prefix = described["CheckpointConfig"]["S3Uri"].removeprefix("s3://").partition("/")
    early = {"steps": 30, "stopped_early": {"step": 30, "best_step": 24, "of": 100}}
    account.client("s3").put_object(Bucket=bucket, Key=f"{prefix.rstrip('/')}/ft/summary.json", Body=json.dumps(early))
    status = invoke_in(tmp_path, "status", "--run-id", "ft")
    assert f"SageMaker job {name} (run ft): finished: stopped early at step 30, best at step 24\n" in status.stdout

    account.job_status(name, "InProgress")  # while it still runs, the same run is not submitted twice
    again = train(tmp_path, account, "--init", "pretrained", "--run-id", "ft")
    assert again.returncode == 2 and f"run ft is still running as SageMaker job {name}" in again.stderr

    stopped = invoke_in(tmp_path, "stop", "--run-id", "ft")
    assert stopped.returncode == 0 and f"stopping SageMaker job {name}" in stopped.stdout, stopped.stderr
    assert sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "Stopping"
    again = invoke_in(tmp_path, "stop", "--run-id", "ft")
    assert "nothing to stop" not in again.stdout  # Stopping still bills: the second stop says it is stopping


def test_logs_come_from_the_hosts_cloudwatch_streams(tmp_path, account):
    done = train(tmp_path, account, "--run-id", "lg", "--nproc", "2", model="llama2-tiny")
    assert done.returncode == 0, done.stderr
    sagemaker, logs = account.client("sagemaker"), account.client("logs")
    name = sagemaker.list_training_jobs()["TrainingJobSummaries"][0]["TrainingJobName"]
    logs.create_log_group(logGroupName="/aws/sagemaker/TrainingJobs")
    # as the hosts write them: algo-2's agent won group rank 0 at the rendezvous
    lines = {
        "algo-1": ["INFO group_rank=1", "[default0]:rank2 step 1", "[default1]:rank3 step 1"],
        "algo-2": ["INFO group_rank=0", "[default0]:rank0 step 1", "[default1]:rank1 step 1"],
    }
    for host, messages in lines.items():
        stream = f"{name}/{host}-{int(time.time())}"
        logs.create_log_stream(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream)
        now_ms = int(time.time() * 1000)  # CloudWatch refuses events over 14 days old
        events = [{"timestamp": now_ms + i, "message": m} for i, m in enumerate(messages)]
        logs.put_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream, logEvents=events)
    leader = invoke_in(tmp_path, "logs", "--run-id", "lg")
    assert leader.returncode == 0, leader.stderr
    assert leader.stdout.splitlines()[0] == f"==> {name}/algo-2 (leader)"
    assert "[default0]:rank0 step 1" in leader.stdout and "rank2" not in leader.stdout
    rank3 = invoke_in(tmp_path, "logs", "--run-id", "lg", "--rank", "3")
    assert rank3.stdout.splitlines() == [f"==> {name}/algo-1 (rank 3)", "[default1]:rank3 step 1"], rank3.stderr
    beyond = invoke_in(tmp_path, "logs", "--run-id", "lg", "--rank", "4")
    assert beyond.returncode == 2 and "--rank 4: job" in beyond.stderr and "ranks 0-3 (2 x 2)" in beyond.stderr


def test_the_request_created_is_the_one_the_model_accepts(tmp_path, account):
    dry = train(tmp_path, account, "--run-id", "same", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert problems("sagemaker", "CreateTrainingJob", json.loads(dry.stdout)["request"]) == []
