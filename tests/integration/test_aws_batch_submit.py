"""`invoke train --target batch` for real, against an account in moto's server with Batch's job side played by the
stand-in (tests/helpers/batch_moto.py): the preflight names every problem before anything is registered or
submitted, a job that passes is registered and submitted as the dry run shows it, and `invoke status / stop
--run-id` find it without `--target`. Here no capacity comes: the job waits RUNNABLE (its nodes run in
tests/e2e/test_aws_batch_runs.py)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.aws_model import problems
from tests.helpers.batch_moto import P_QUOTA, batch_account
from tests.helpers.product import invoke_in

TOKEN = "hf_batchSubmitTokenThatMustNeverBeShown"


@pytest.fixture
def account(tmp_path, monkeypatch, request):
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))
    options = getattr(request, "param", {})
    with batch_account(tmp_path, quotas={P_QUOTA["code"]: 2 * 192}, **options) as found:
        for name, value in found.env.items():
            monkeypatch.setenv(name, value)
        yield found


def train(folder, account, *flags: str, image: str | None = None):
    image = image or account.image
    return invoke_in(folder, "train", "--model", "llama2-7b", "--target", "batch", "--image", image, *flags)


@pytest.mark.parametrize("account", [{"capacity": "SPOT", "max_nodes": 2}], indirect=True)
def test_the_preflight_names_every_problem_before_anything_is_created(tmp_path, account):
    account.client("iam").delete_role(RoleName="trainkit-batch-job")
    done = train(tmp_path, account, "--nodes", "4", "--init", "pretrained", image=account.image + "-missing")
    assert done.returncode == 2, done.stderr
    error = done.stderr
    assert "cannot submit to AWS Batch:" in error
    assert "--nodes 4: the stack's Batch compute environment launches at most 2 nodes" in error
    assert "SPOT capacity: multi-node parallel jobs need EC2 on-demand instances" in error
    assert "job role arn:aws:iam::123456789012:role/trainkit-batch-job: NoSuchEntity" in error
    assert "is not in ECR (ImageNotFoundException)" in error
    assert (
        f"the account's EC2 quota {P_QUOTA['name']!r} (L-417A185B) is 384 vCPUs and 4 x p5.48xlarge need 768" in error
    )
    assert "--init pretrained needs the Hugging Face token in arn:aws:secretsmanager:" in error
    batch = account.client("batch")
    assert batch.describe_job_definitions(status="ACTIVE")["jobDefinitions"] == []
    assert account.service.jobs == {}


def test_a_job_is_registered_submitted_and_found_without_target(tmp_path, account):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    stored = invoke_in(tmp_path, "secrets.hf-token", "--target", "batch", "--file", str(token))
    assert stored.returncode == 0 and TOKEN not in stored.stdout + stored.stderr, stored.stderr
    flags = ("--nodes", "2", "--run-id", "pt", "--init", "pretrained", "--max-runtime", "2h")
    flags += ("--track", "mlflow", "--tracking-uri", "http://127.0.0.1:9")  # a team's server, which wants a token
    unstored = train(tmp_path, account, *flags, "--dry-run")  # the MLflow token's secret holds no value yet
    assert "MLFLOW_TRACKING_TOKEN" in unstored.stdout and "holds a value at submission" in unstored.stderr
    stored = invoke_in(tmp_path, "secrets.mlflow-token", "--target", "batch", "--file", str(token))
    assert (
        stored.returncode == 0
        and f"MLflow tracking server's token in {account.stack['mlflow_token_secret_arn']}" in stored.stdout
    )
    dry = train(tmp_path, account, *flags, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    done = train(tmp_path, account, *flags)
    assert done.returncode == 0, done.stderr
    assert "submitted Batch job pt-" in done.stdout and TOKEN not in done.stdout + done.stderr

    (job,) = account.service.jobs.values()
    shown = json.loads(dry.stdout)
    assert problems("batch", "SubmitJob", job.request) == []
    assert job.request["nodeOverrides"] == shown["submitJob"]["nodeOverrides"]  # the values the dry run showed
    definition = job.definition
    assert definition.name == shown["registerJobDefinition"]["jobDefinitionName"] and definition.revision == 1
    container = definition.node_properties["nodeRangeProperties"][0]["container"]
    assert container["secrets"] == [
        {"name": "HF_TOKEN", "valueFrom": account.stack["hf_token_secret_arn"]},
        {"name": "MLFLOW_TRACKING_TOKEN", "valueFrom": account.stack["mlflow_token_secret_arn"]},
    ]
    assert definition.timeout == {"attemptDurationSeconds": 7200}
    assert TOKEN not in json.dumps(job.request) + json.dumps(definition.node_properties)
    tags = account.client("ecr").describe_images(repositoryName="trainkit/train")["imageDetails"][0]["imageTags"]
    assert "run-pt" in tags  # kept while the run may resume on it

    status = invoke_in(tmp_path, "status", "--run-id", "pt")
    assert status.returncode == 0, status.stderr
    assert f"(run pt), id {job.id}" in status.stdout and "status RUNNABLE, 2 x p5.48xlarge" in status.stdout

    again = train(tmp_path, account, *flags)
    assert again.returncode == 2 and "run pt is still RUNNABLE as Batch job pt-" in again.stderr, again.stderr

    stopped = invoke_in(tmp_path, "stop", "--run-id", "pt")
    assert stopped.returncode == 0 and "cancelled Batch job pt-" in stopped.stdout, stopped.stderr
    assert account.client("batch").describe_jobs(jobs=[job.id])["jobs"][0]["status"] == "FAILED"
    again = train(tmp_path, account, *flags)
    assert again.returncode == 0, again.stderr
    assert {j.definition.arn for j in account.service.jobs.values()} == {definition.arn}  # the shape's, reused
    nothing = invoke_in(tmp_path, "stop", "--run-id", "pt", "--target", "batch")
    assert "cancelled Batch job pt-" in nothing.stdout  # the newest submission of the run
