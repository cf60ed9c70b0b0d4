"""SageMaker jobs run on the stand-in (tests/helpers/sagemaker_standin.py): the job as `invoke train --target
sagemaker` submits it, each host's entry point as a local process with its own /opt/ml tree, the states, the
CloudWatch streams and the S3 uploads as SageMaker makes them."""

from __future__ import annotations

import io
import json
import re
import tarfile
import time

import pytest

from tests.helpers.product import invoke_in
from tests.helpers.sagemaker_moto import sagemaker_account

P5 = "ml.p5.48xlarge for training job usage"
P5_SPOT = "ml.p5.48xlarge for spot training job usage"


@pytest.fixture
def account(tmp_path, monkeypatch):
    with sagemaker_account(tmp_path, quotas={P5: 4, P5_SPOT: 2}, run_jobs=True) as found:
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
    return re.search(r"submitted SageMaker job (\S+) ", done.stdout)[1]


def s3_object(account, key: str) -> bytes:
    return account.client("s3").get_object(Bucket=account.stack["bucket"], Key=key)["Body"].read()


def test_a_two_host_job_stopped_and_submitted_again_completes_with_summary_metrics_and_model(tmp_path, account):
    name = submit(tmp_path, account, "sm2", *JOB)
    for host in ("algo-1", "algo-2"):
        wait_for_key(account, f"checkpoints/sm2/sm2/checkpoints/step-00000004/COMPLETE.{host}")
    stopped = invoke_in(tmp_path, "stop", "--run-id", "sm2")
    assert stopped.returncode == 0 and f"stopping SageMaker job {name}" in stopped.stdout, stopped.stderr
    assert account.wait(name, timeout=240)["TrainingJobStatus"] == "Stopped"
    events = [json.loads(e) for e in s3_object(account, "checkpoints/sm2/sm2/events.jsonl").decode().splitlines()]
    assert [e for e in events if e["event"] == "stop"], events  # SIGTERM reached the ranks: a stop at a step

    name = submit(tmp_path, account, "sm2", *JOB)  # the same command resumes it
    described = account.wait(name, timeout=240)
    assert described["TrainingJobStatus"] == "Completed", (described.get("FailureReason"), described)
    statuses = [t["Status"] for t in described["SecondaryStatusTransitions"]]
    assert statuses == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
    # the run folder reached the checkpoint prefix: its summary and metrics, resumed from the first job's
    summary = json.loads(s3_object(account, "checkpoints/sm2/sm2/summary.json"))
    assert summary["steps"] == 24
    events = [json.loads(e) for e in s3_object(account, "checkpoints/sm2/sm2/events.jsonl").decode().splitlines()]
    assert [e for e in events if e["event"] == "resume" and e["step"] >= 4], events
    metrics = s3_object(account, "checkpoints/sm2/sm2/metrics.jsonl").decode().splitlines()
    assert json.loads(metrics[-1])["step"] == 24
    # the exported model, packed from the /opt/ml/model of the host that exported it
    packed = s3_object(account, f"runs/sm2/output/{name}/output/model.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(packed)) as archive:
        names = archive.getnames()
    assert "config.json" in names and any(n.endswith(".safetensors") for n in names), names

    status = invoke_in(tmp_path, "status", "--run-id", "sm2")
    assert f"SageMaker job {name} (run sm2)" in status.stdout and "status Completed / Completed" in status.stdout
    rank1 = invoke_in(tmp_path, "logs", "--run-id", "sm2", "--rank", "1")
    assert rank1.returncode == 0, rank1.stderr
    lines = rank1.stdout.splitlines()
    assert lines[0].startswith(f"==> {name}/algo-") and lines[0].endswith("(rank 1)")
    assert len(lines) > 1 and all(line.startswith("[default0]:") for line in lines[1:])
    # the report reads the run's files from its checkpoint prefix
    report = invoke_in(tmp_path, "obs.report", "--run", "sm2")
    assert report.returncode == 0 and "copied to runs/sm2" in report.stdout, report.stderr
    assert (tmp_path / "runs" / "sm2" / "report.png").stat().st_size > 10_000


def losses(account, run_id: str) -> list[str]:
    """The run's loss per step as the progress line prints it (4 decimals), from its metrics in S3."""
    lines = s3_object(account, f"checkpoints/{run_id}/{run_id}/metrics.jsonl").decode().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [f"{r['loss']:.4f}" for r in records if "loss" in r]


def wait_for_key(account, key: str, timeout: float = 300) -> None:
    s3, deadline = account.client("s3"), time.monotonic() + timeout
    while s3.list_objects_v2(Bucket=account.stack["bucket"], Prefix=key).get("KeyCount", 0) == 0:
        assert time.monotonic() < deadline, f"{key} never reached S3"
        time.sleep(0.5)


# long enough that the interruption lands while it trains (about 1 s a step on two CPU cores)
JOB = ("--model", "llama2-tiny", "--nodes", "2", "--nproc", "1", "--steps", "24", "--checkpoint-interval", "4")


def test_a_spot_interruption_resumes_from_the_restored_checkpoint_with_the_same_losses(tmp_path, account):
    reference = account.wait(submit(tmp_path, account, "ref", *JOB), timeout=240)
    assert reference["TrainingJobStatus"] == "Completed", reference.get("FailureReason")
    name = submit(tmp_path, account, "spot", *JOB, "--spot")
    # the first checkpoint, whole: both hosts' markers are in the prefix
    for host in ("algo-1", "algo-2"):
        wait_for_key(account, f"checkpoints/spot/spot/checkpoints/step-00000004/COMPLETE.{host}")
    account.runners[name].interrupt(grace=False)  # the instances are gone at once: no upload after this
    described = account.wait(name, timeout=240)
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    statuses = [t["Status"] for t in described["SecondaryStatusTransitions"]]
    assert "Interrupted" in statuses and statuses.count("Training") == 2, statuses
    events = s3_object(account, "checkpoints/spot/spot/events.jsonl").decode().splitlines()
    resumed = [json.loads(e) for e in events if json.loads(e)["event"] == "resume"]
    assert resumed and resumed[-1]["step"] >= 4, events
    assert losses(account, "spot") == losses(account, "ref")
