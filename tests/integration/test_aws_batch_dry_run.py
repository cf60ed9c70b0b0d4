"""`--target batch --dry-run` as a user types it: the RegisterJobDefinition and SubmitJob requests on stdout, accepted
by botocore's Batch service model (tests/helpers/aws_model.py), with the job's shape in them and no secret anywhere
in what is printed. Every instance type's requests: tests/unit/test_aws_batch_request.py."""

from __future__ import annotations

import json

import pytest

from tests.helpers.aws_model import problems
from tests.helpers.paths import REPO
from tests.helpers.product import invoke_in
from trainkit.infra.outputs import save_outputs

TOKEN = "hf_batchDryRunTokenThatMustNeverBePrinted"


@pytest.fixture(autouse=True)
def own_state(tmp_path, monkeypatch):
    """No stack this checkout recorded leaks in: each test records its own, or none."""
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))


def dry_run(folder, *args: str, script_args: tuple[str, ...] = ()) -> tuple[dict, dict, str]:
    done = invoke_in(folder, *args, "--target", "batch", "--dry-run", "--", *script_args)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    register, submit = printed["registerJobDefinition"], printed["submitJob"]
    assert problems("batch", "RegisterJobDefinition", register) == []
    assert problems("batch", "SubmitJob", submit) == []
    return register, submit, done.stdout + done.stderr


def test_bert_1_5b_on_16_nodes_prints_requests_the_service_model_accepts(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    register, submit, printed = dry_run(
        tmp_path, "train", "--model", "bert-1.5b", "--nodes", "16", "--hf-token-file", str(token)
    )
    (nodes,) = register["nodeProperties"]["nodeRangeProperties"]
    container = nodes["container"]
    assert register["type"] == "multinode" and register["nodeProperties"]["numNodes"] == 16
    assert {"type": "GPU", "value": "8"} in container["resourceRequirements"]
    assert len(container["linuxParameters"]["devices"]) == 32  # p5.48xlarge's EFA devices
    assert container["mountPoints"] == [{"sourceVolume": "fsx", "containerPath": "/fsx", "readOnly": False}]
    assert container["secrets"][0]["valueFrom"].startswith("arn:aws:secretsmanager:")  # the ARN, not the value
    assert register["retryStrategy"]["attempts"] == 4 and submit["jobDefinition"] == register["jobDefinitionName"]
    assert TOKEN not in printed and "placeholders" in printed


def test_a_users_script_travels_in_the_submit_request(tmp_path):
    script = REPO / "examples" / "lightning_ddp.py"
    _, submit, printed = dry_run(tmp_path, "run", "--script", str(script), "--nodes", "2", script_args=("--steps", "3"))
    (override,) = submit["nodeOverrides"]["nodePropertyOverrides"]
    names = [e["name"] for e in override["containerOverrides"]["environment"]]
    assert names == ["TRAINKIT_SPEC", "TRAINKIT_WORKLOAD", "TRAINKIT_CODE"]
    assert len(json.dumps(submit)) < 30 * 1024


def test_the_recorded_stack_fills_the_requests(tmp_path):
    """What `make up PROFILE=aws` recorded with batch_enabled: the `batch` output's queue, roles, mount, log group and
    instance types, and the stack's tag."""
    stack = {
        "job_queue_arn": "arn:aws:batch:us-east-1:123456789012:job-queue/trainkit-x-batch",
        "job_queue_name": "trainkit-x-batch",
        "compute_environment_arn": "arn:aws:batch:us-east-1:123456789012:compute-environment/trainkit-x-batch",
        "job_role_arn": "arn:aws:iam::123456789012:role/trainkit-x-batch-job",
        "execution_role_arn": "arn:aws:iam::123456789012:role/trainkit-x-batch-execution",
        "instance_types": ["p4d.24xlarge"],
        "fsx_mount_path": "/fsx",
        "log_group": "/aws/batch/job",
        "hf_token_secret_arn": None,
        "max_nodes": 2,
    }
    save_outputs({"gpu_instance_type": "p5.48xlarge", "region": "us-east-1", "stack_id": "trainkit-x", "batch": stack})
    register, submit, printed = dry_run(tmp_path, "train", "--model", "bert-tiny", "--nodes", "4")
    container = register["nodeProperties"]["nodeRangeProperties"][0]["container"]
    assert container["instanceType"] == "p4d.24xlarge" and len(container["linuxParameters"]["devices"]) == 4
    assert container["jobRoleArn"] == stack["job_role_arn"] and "secrets" not in container
    assert submit["jobQueue"] == stack["job_queue_arn"] and submit["tags"]["trainkit:stack-id"] == "trainkit-x"
    assert "placeholders" not in printed
    assert (
        "a submission would be refused: --nodes 4: the stack's Batch compute environment launches at most 2" in printed
    )
