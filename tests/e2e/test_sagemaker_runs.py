"""SageMaker jobs run on the stand-in (tests/helpers/sagemaker_standin.py): the job as `invoke train --target
sagemaker` submits it, each host's entry point as a local process with its own /opt/ml tree, the states, the
CloudWatch streams and the S3 uploads as SageMaker makes them."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from tests.helpers.product import invoke_in
from tests.helpers.sagemaker_moto import sagemaker_account

P5 = "ml.p5.48xlarge for training job usage"


@pytest.fixture
def account(tmp_path, monkeypatch):
    with sagemaker_account(tmp_path, quotas={P5: 4}, run_jobs=True) as found:
        for name, value in found.env.items():
            monkeypatch.setenv(name, value)
        yield found


def submit(folder, account, run_id: str, *flags: str) -> str:
    done = invoke_in(
        folder,
        "train",
        "--target",
        "sagemaker",
        "--image",
        account.image,
        "--run-id",
        run_id,
        "--metrics-port",
        "0",
        *flags,
    )
    assert done.returncode == 0, done.stderr
    return account.client("sagemaker").list_training_jobs()["TrainingJobSummaries"][0]["TrainingJobName"]


def s3_object(account, key: str) -> bytes:
    return account.client("s3").get_object(Bucket=account.stack["bucket"], Key=key)["Body"].read()


def test_a_two_host_llama_job_completes_with_summary_metrics_and_model(tmp_path, account):
    name = submit(tmp_path, account, "sm2", "--model", "llama2-tiny", "--nodes", "2", "--nproc", "1", "--steps", "8")
    described = account.wait(name)
    assert described["TrainingJobStatus"] == "Completed", (described.get("FailureReason"), described)
    statuses = [t["Status"] for t in described["SecondaryStatusTransitions"]]
    assert statuses == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
    # the run folder reached the checkpoint prefix: its summary and metrics
    summary = json.loads(s3_object(account, "checkpoints/sm2/sm2/summary.json"))
    assert summary["steps"] == 8
    metrics = s3_object(account, "checkpoints/sm2/sm2/metrics.jsonl").decode().splitlines()
    assert json.loads(metrics[-1])["step"] == 8
    # the exported model, packed from the first host's /opt/ml/model
    packed = s3_object(account, f"runs/sm2/output/{name}/output/model.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(packed)) as archive:
        names = archive.getnames()
    assert "config.json" in names and any(n.endswith(".safetensors") for n in names), names

    status = invoke_in(tmp_path, "status", "--run-id", "sm2")
    assert "status Completed / Completed" in status.stdout and "Uploading" in status.stdout, status.stderr
    rank1 = invoke_in(tmp_path, "logs", "--run-id", "sm2", "--rank", "1")
    assert rank1.returncode == 0, rank1.stderr
    lines = rank1.stdout.splitlines()
    assert lines[0].startswith(f"==> {name}/algo-") and lines[0].endswith("(rank 1)")
    assert len(lines) > 1 and all(line.startswith("[default0]:") for line in lines[1:])
