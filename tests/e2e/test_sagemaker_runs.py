"""SageMaker jobs run on the stand-in (tests/helpers/sagemaker_standin.py): the job as `invoke train --target
sagemaker` submits it, each host's entry point as a local process with its own /opt/ml tree, the states, the
CloudWatch streams and the S3 uploads as SageMaker makes them.

Each test runs two jobs at once: most of a job's time here is processes starting and files moving, which the two
share, so the file stays inside the SageMaker work's two minutes of CI."""

from __future__ import annotations

import io
import json
import re
import tarfile
import time

import pytest

from tests.helpers.aws import REGION
from tests.helpers.paths import REPO
from tests.helpers.product import invoke_in, job_processes
from tests.helpers.sagemaker_moto import sagemaker_account
from tests.helpers.tiny_decoders import write_pretrained
from tests.helpers.tracked import steps_of, tracked_runs
from tests.helpers.waiting import wait_for
from training.common.faults import HANG_ENV, MARKERS_ENV
from training.text.dialogues import write_dialogues
from training.vision.synthetic import SyntheticTree, write_tree

P5 = "ml.p5.48xlarge for training job usage"
P5_SPOT = "ml.p5.48xlarge for spot training job usage"


@pytest.fixture
def account(tmp_path, monkeypatch):
    with sagemaker_account(tmp_path, quotas={P5: 4, P5_SPOT: 2}, run_jobs=True) as found:
        for name, value in found.env.items():
            monkeypatch.setenv(name, value)
        yield found


def submit(folder, account, run_id: str, *flags: str, command: str = "train", script_args: tuple = ()) -> str:
    done = invoke_in(
        folder,
        command,
        "--target",
        "sagemaker",
        "--image",
        account.image,
        "--run-id",
        run_id,
        "--metrics-port",
        "0",
        *flags,
        *(("--", *script_args) if script_args else ()),
    )
    assert done.returncode == 0, done.stderr
    return re.search(r"submitted SageMaker job (\S+) ", done.stdout)[1]


def s3_object(account, key: str) -> bytes:
    return account.client("s3").get_object(Bucket=account.stack["bucket"], Key=key)["Body"].read()


def losses(account, run_id: str) -> list[str]:
    """The run's loss per step as the progress line prints it (4 decimals), from its metrics in S3."""
    lines = s3_object(account, f"checkpoints/{run_id}/{run_id}/metrics.jsonl").decode().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [f"{r['loss']:.4f}" for r in records if "loss" in r]


def wait_for_key(account, name: str, key: str, timeout: float = 300) -> None:
    """Until `key` is in the bucket; a job `name` that ends first fails the test with its reason."""
    s3, sagemaker, deadline = account.client("s3"), account.client("sagemaker"), time.monotonic() + timeout
    while s3.list_objects_v2(Bucket=account.stack["bucket"], Prefix=key).get("KeyCount", 0) == 0:
        described = sagemaker.describe_training_job(TrainingJobName=name)
        assert described["TrainingJobStatus"] == "InProgress", (key, described.get("FailureReason"))
        assert time.monotonic() < deadline, f"{key} never reached S3"
        time.sleep(0.5)


def upload_tree(account, tree, prefix: str) -> str:
    """Every file under `tree` to the runs bucket under `prefix`: the s3:// URL a user gives as --data."""
    s3, bucket = account.client("s3"), account.stack["bucket"]
    for path in sorted(p for p in tree.rglob("*") if p.is_file()):
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{path.relative_to(tree)}", Body=path.read_bytes())
    return f"s3://{bucket}/{prefix}/"


def events(account, run_id: str) -> list[dict]:
    """The run's events from its checkpoint prefix: events.jsonl and each host agent's events.<host>.jsonl."""
    s3, prefix = account.client("s3"), f"checkpoints/{run_id}/{run_id}/"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=account.stack["bucket"], Prefix=prefix)["Contents"]]
    names = [key for key in keys if re.fullmatch(r"events(\.[^/]+)?\.jsonl", key[len(prefix) :])]
    lines = [line for key in names for line in s3_object(account, key).decode().splitlines()]
    return sorted((json.loads(line) for line in lines if line.strip()), key=lambda e: e["time"])


# The interruption lands after the step-8 checkpoint and before the step-12 one (about 1 s a step on two CPU cores,
# slower with two jobs): 12 steps leave that window as long as more would, and the restarted hosts little to redo.
JOB = ("--model", "llama2-tiny", "--nodes", "2", "--nproc", "1", "--steps", "12", "--checkpoint-interval", "4")


def test_a_two_host_job_completes_and_a_stalled_then_spot_interrupted_copy_resumes_with_the_same_losses(
    tmp_path, account, gated_mlflow
):
    """`spot` hangs in step 6 (rank 1 sleeps, outside any collective; rank 0 waits for it in one): the hosts'
    watchdogs end the ranks, each host fetches the other's part of the step-4 checkpoint from S3 and the workers
    restart in place; after its step-8 checkpoint its instances are lost. `hung` freezes with no restart left."""
    markers = str(tmp_path / "hang-markers")  # the hosts share no disk: the fault strikes once per run from here
    account.run_env["spot"] = {HANG_ENV: "sleep@1:6", MARKERS_ENV: markers}
    account.run_env["hung"] = {HANG_ENV: "sigstop@1:5", MARKERS_ENV: markers}
    stall = ("--stall-timeout", "6")
    # Held-out records of their own in S3 (the job's eval channel), evaluated at each checkpoint: SageMaker's metric
    # definitions read the figures.
    write_dialogues(tmp_path / "held" / "held.jsonl", count=40, seed=9)
    held = ("--eval-data", upload_tree(account, tmp_path / "held", "datasets/held"))
    # A LoRA fine-tune (issue 53) of pretrained weights in S3, the job's weights channel: the adapters' checkpoints
    # are published per host and restored from S3 as any other's.
    base = upload_tree(account, write_pretrained(tmp_path / "base", "llama2-tiny", seed=2), "datasets/base")
    held += ("--init", "pretrained", "--weights", base, "--lora-rank", "8")
    reference = submit(tmp_path, account, "ref", *JOB, *held)
    # `spot` logs to an MLflow server (issue 54): one MLflow run through its stall restart and its spot interruption;
    # the server takes only requests with its token, which the hosts read from the stack's secret
    stored = account.client("secretsmanager")
    stored.put_secret_value(SecretId=account.stack["mlflow_token_secret_arn"], SecretString=gated_mlflow.token)
    tracked = ("--track", "mlflow", "--tracking-uri", gated_mlflow.url, "--experiment", "sagemaker")
    spot = submit(tmp_path, account, "spot", *JOB, *held, "--spot", *stall, *tracked)
    hung = submit(tmp_path, account, "hung", *JOB, *held, *stall, "--max-restarts", "0")
    # the job's region in the request (moto's describe leaves Environment out): the hosts' boto3 clients need one
    assert account.runners[hung].request["Environment"]["TRAINKIT_AWS_REGION"] == REGION

    # no restart left: the job fails with the stall's cause, and none of its processes stays
    described = account.wait(hung, timeout=240)
    assert described["TrainingJobStatus"] == "Failed", described
    reason = described["FailureReason"]
    assert reason.startswith("AlgorithmError: algo-") and "stalled: " in reason and "after step 4" in reason, reason
    assert "every rank's stacks are in its log" in reason, reason
    assert all(process.poll() is not None for process in account.runners[hung].processes.values())
    wait_for(lambda: not job_processes(f"/{hung}/"), 10, "every process of the failed job gone")
    status = invoke_in(tmp_path, "status", "--run-id", "hung")
    assert "stalled: " in status.stdout, status.stdout

    # the checkpoint after the restart, whole: both hosts' markers are in the prefix
    for host in ("algo-1", "algo-2"):
        wait_for_key(account, spot, f"checkpoints/spot/spot/checkpoints/step-00000008/COMPLETE.{host}")
    account.runners[spot].interrupt(grace=False)  # the instances are gone at once: no upload after this

    described = account.wait(reference, timeout=240)
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    statuses = [t["Status"] for t in described["SecondaryStatusTransitions"]]
    assert statuses == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
    # the run folder reached the checkpoint prefix: its summary and metrics
    summary = json.loads(s3_object(account, "checkpoints/ref/ref/summary.json"))
    assert summary["steps"] == 12 and summary["world_size"] == 2, summary
    metrics = s3_object(account, "checkpoints/ref/ref/metrics.jsonl").decode().splitlines()
    assert json.loads(metrics[-1])["step"] == 12
    # the exported adapter, packed from the model folder of the host that exported it
    packed = s3_object(account, f"runs/ref/output/{reference}/output/model.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(packed)) as archive:
        names = archive.getnames()
    assert "adapter_config.json" in names and "adapter_model.safetensors" in names, names

    # the metric definitions read the leader's log: the last evaluation's figures, as metrics.jsonl has them
    final = {m["MetricName"]: m["Value"] for m in described["FinalMetricDataList"]}
    last_eval = [json.loads(line) for line in metrics if "eval_loss" in line][-1]
    assert last_eval["step"] == 12 and final["eval_loss"] == round(last_eval["eval_loss"], 4), (final, last_eval)
    assert final["eval_ppl"] == round(last_eval["eval_ppl"], 4) and final["loss"] > 0, final
    status = invoke_in(tmp_path, "status", "--run-id", "ref")
    assert f"SageMaker job {reference} (run ref)" in status.stdout and "status Completed / Completed" in status.stdout
    assert f"eval_loss {final['eval_loss']:.4g}" in status.stdout, status.stdout
    rank1 = invoke_in(tmp_path, "logs", "--run-id", "ref", "--rank", "1")
    assert rank1.returncode == 0, rank1.stderr
    lines = rank1.stdout.splitlines()
    assert lines[0].startswith(f"==> {reference}/algo-") and lines[0].endswith("(rank 1)")
    assert len(lines) > 1 and all(line.startswith("[default0]:") for line in lines[1:])
    leader = invoke_in(tmp_path, "logs", "--run-id", "ref").stdout  # the held-out records, from the eval channel
    assert "/input/data/eval (held-out)" in leader and "held-out 40 " in leader, leader[-3000:]
    # the report reads the run's files from its checkpoint prefix
    report = invoke_in(tmp_path, "obs.report", "--run", "ref")
    assert report.returncode == 0 and "copied to runs/ref" in report.stdout, report.stderr
    assert (tmp_path / "runs" / "ref" / "report.png").stat().st_size > 10_000

    # the interrupted job restarted on fresh instances, resumed from the restored checkpoint, and computed the same
    described = account.wait(spot, timeout=240)
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    statuses = [t["Status"] for t in described["SecondaryStatusTransitions"]]
    assert "Interrupted" in statuses and statuses.count("Training") == 2, statuses
    found = events(account, "spot")
    stalled = [e for e in found if e["event"] == "stalled"]
    assert stalled and all(e["restart"] and e["step"] == 5 for e in stalled), stalled
    # a host's watchdog saw its rank hung outside any collective, or waiting in one for the other host's
    doing = {e["ranks"][r]["doing"] for e in stalled for r in e["ranks"]}
    assert any(d.startswith(("not in a collective: ", "waiting in a collective")) for d in doing), doing
    assert [e["step"] for e in found if e["event"] == "resume"] == [4, 8], found
    assert losses(account, "spot") == losses(account, "ref")
    client, (run,) = tracked_runs(gated_mlflow.upstream, "spot")
    assert run.info.status == "FINISHED" and run.data.tags["trainkit.target"] == "sagemaker"
    assert steps_of(client, run.info.run_id) == list(range(1, 13))  # each step once, through both restarts
    assert steps_of(client, run.info.run_id, "eval_loss") == [4, 8, 12]


def test_a_users_lightning_script_stopped_and_resubmitted_and_the_vision_recipe_complete_on_two_hosts(
    tmp_path, account
):
    """The vision recipe reads its images from the data channel and loses its spot instances with a grace after its
    first checkpoint; the Lightning script is stopped with `invoke stop`, and the same command resumes it."""
    # Both ranks of the vision job's first attempt wait in their step-6 save until the grace's SIGTERM reaches them:
    # on a quiet machine the job otherwise finished before the test interrupted it.
    gate = "hold@0:6,hold@1:6"
    markers = tmp_path / "hold-markers"
    account.run_env["vis"] = {HANG_ENV: gate, MARKERS_ENV: str(markers)}
    tree = write_tree(tmp_path / "images", SyntheticTree(classes=10, per_class=8, val_per_class=2))
    data = upload_tree(account, tree, "datasets/synthetic")
    two_hosts = ("--nodes", "2", "--nproc", "1")
    vision = submit(
        tmp_path, account, "vis", "--model", "resnet-tiny", "--data", data, "--epochs", "6", *two_hosts, "--spot"
    )  # 80 images, a global batch of 40: 2 steps an epoch, a checkpoint at each epoch's end
    script = ("--script", str(REPO / "examples" / "lightning_ddp.py"), *two_hosts)
    script_args = ("--steps", "20", "--save-every", "5", "--step-sleep", "0.4")
    lightning = submit(tmp_path, account, "lit", *script, command="run", script_args=script_args)

    # The script is stopped as soon as its first checkpoint is up, before the vision job's waits: under load those
    # took long enough for the script's 20 steps to finish first (nothing left to stop).
    wait_for_key(account, lightning, "checkpoints/lit/lit/checkpoints/last.ckpt")
    stopped = invoke_in(tmp_path, "stop", "--run-id", "lit")
    assert stopped.returncode == 0 and f"stopping SageMaker job {lightning}" in stopped.stdout, stopped.stderr
    for host in ("algo-1", "algo-2"):
        wait_for_key(account, vision, f"checkpoints/vis/vis/checkpoints/step-00000004/COMPLETE.{host}")
    wait_for(lambda: all((markers / held).exists() for held in gate.split(",")), 240, "the vision job held at step 6")
    account.runners[vision].interrupt(grace=True)
    assert account.wait(lightning, timeout=240)["TrainingJobStatus"] == "Stopped"
    lightning = submit(tmp_path, account, "lit", *script, command="run", script_args=script_args)

    # Within the grace the ranks stopped at a step and checkpointed it (unless an epoch's end just had), the hosts
    # uploaded it, and the job, restarted on fresh instances, resumed from that step.
    described = account.wait(vision, timeout=240)
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    statuses = [t["Status"] for t in described["SecondaryStatusTransitions"]]
    assert "Interrupted" in statuses and statuses.count("Training") == 2, statuses
    found = events(account, "vis")
    at = next(i for i, e in enumerate(found) if e["event"] == "stop")
    stop, resume = found[at], [e for e in found if e["event"] == "resume"]
    assert stop["step"] == 6 and stop["checkpoint"] in (stop["step"], None), stop
    assert [e["step"] for e in found[:at] if e["event"] == "checkpoint"][-1] == stop["step"], found
    assert resume and resume[-1]["step"] == stop["step"], found
    summary = json.loads(s3_object(account, "checkpoints/vis/vis/summary.json"))
    assert summary["steps"] == 12 and summary["world_size"] == 2, summary

    # the script went on from Lightning's last.ckpt, restored from S3: every step reported once
    described = account.wait(lightning, timeout=240)
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    lines = s3_object(account, "checkpoints/lit/lit/metrics.jsonl").decode().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 21)), lines
    logs = invoke_in(tmp_path, "logs", "--run-id", "lit")
    assert "resuming from" in logs.stdout, logs.stdout[-2000:]
