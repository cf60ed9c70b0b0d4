"""`--target sagemaker --dry-run`: the CreateTrainingJob request for every model and for a user's script, as a user
types it, accepted by botocore's SageMaker service model (tests/helpers/aws_model.py), with the job's shape in it
and no secret anywhere in what is printed."""

from __future__ import annotations

import json

import pytest

from tests.helpers.aws_model import problems
from tests.helpers.paths import REPO
from tests.helpers.product import invoke_in
from training.registry import REGISTRY
from trainkit.backends.sagemaker.request import CHECKPOINTS
from trainkit.infra.outputs import save_outputs

TOKEN = "hf_sagemakerDryRunTokenThatMustNeverBePrinted"


def dry_run(folder, *args: str, script_args: tuple[str, ...] = ()) -> tuple[dict, str]:
    """(the request, all that was printed); the launch channel's files are checked beside it."""
    done = invoke_in(folder, *args, "--target", "sagemaker", "--nodes", "2", "--dry-run", "--", *script_args)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    launch = printed["request"]["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"]
    assert all(path.startswith(launch) for path in printed["uploads"]), (launch, list(printed["uploads"]))
    return printed["request"], done.stdout + done.stderr


@pytest.mark.parametrize("model", list(REGISTRY))
def test_every_model_makes_a_request_the_service_model_accepts(model, tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    body, printed = dry_run(tmp_path, "train", "--model", model, "--hf-token-file", str(token))
    assert problems("sagemaker", "CreateTrainingJob", body) == []
    resources = body["ResourceConfig"]
    assert resources["InstanceType"] == "ml.p5.48xlarge" and resources["InstanceCount"] == 2
    assert body["CheckpointConfig"]["LocalPath"] == CHECKPOINTS
    assert body["CheckpointConfig"]["S3Uri"].endswith(f"/checkpoints/{body['Tags'][0]['Value']}/")  # exp1 not exp10
    assert body["OutputDataConfig"]["S3OutputPath"].startswith("s3://")
    assert body["VpcConfig"]["Subnets"] and body["VpcConfig"]["SecurityGroupIds"]
    assert TOKEN not in printed
    assert "HF_TOKEN" not in body["Environment"]  # the secret's ARN travels; the instances read the value
    assert "HyperParameters" not in body  # shown to anyone who may describe the job: nothing travels there
    assert body["OutputDataConfig"]["KmsKeyId"].startswith("arn:aws:kms:")  # the output is encrypted with a key
    assert body["EnableInterContainerTrafficEncryption"] is False  # the stack's default


def test_a_users_script_makes_a_request_the_service_model_accepts(tmp_path):
    script = REPO / "examples" / "lightning_ddp.py"
    tracked = ("--track", "mlflow", "--tracking-uri", "http://127.0.0.1:9")
    body, printed = dry_run(tmp_path, "run", "--script", str(script), *tracked, script_args=("--steps", "3"))
    assert problems("sagemaker", "CreateTrainingJob", body) == []
    # the MLflow token's secret by its ARN (the hosts read the value), as for the Hugging Face token
    assert body["Environment"]["TRAINKIT_MLFLOW_TRACKING_TOKEN_SECRET_ARN"].endswith(":secret:trainkit-mlflow-token")
    assert "MLFLOW_TRACKING_TOKEN" not in body["Environment"]
    assert body["ResourceConfig"]["InstanceCount"] == 2
    assert "/code/" in printed and "lightning_ddp.py" in printed  # the script's folder travels in the launch channel


def test_spot_and_deadlines_reach_the_stopping_condition(tmp_path):
    body, _ = dry_run(tmp_path, "train", "--model", "llama2-tiny", "--spot", "--max-runtime", "4h")
    assert body["EnableManagedSpotTraining"] is True
    assert body["StoppingCondition"] == {"MaxRuntimeInSeconds": 14400, "MaxWaitTimeInSeconds": 28800}
    assert problems("sagemaker", "CreateTrainingJob", body) == []


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--nodes", "1:2"), "SageMaker runs a job on a fixed number of instances"),
        (("--rdzv", "etcd"), "a SageMaker job meets on its first host"),
        (("--instance-type", "ml.g5.48xlarge"), "is not in the instance table; choose one of: ml.p4d.24xlarge"),
        (("--max-wait", "1h"), "--max-wait bounds a spot job's wait: add --spot"),
        (("--spot", "--max-runtime", "2h", "--max-wait", "1h"), "is shorter than --max-runtime"),
        # against what the request would say: SageMaker's default runtime (1 day), and its 28-day maximum
        (("--spot", "--max-wait", "2h"), "--max-wait 7200 s is shorter than SageMaker's default runtime (86400 s)"),
        (("--max-runtime", "30d"), "--max-runtime 2592000 s is more than SageMaker allows a training job, 28 days"),
        (("--max-runtime", "soon"), "--max-runtime 'soon': give a whole number of seconds"),
    ],
)
def test_what_sagemaker_cannot_do_is_refused_before_anything(flags, said, tmp_path):
    done = invoke_in(tmp_path, "train", "--model", "llama2-tiny", "--target", "sagemaker", *flags, "--dry-run")
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert done.stdout == ""


def test_other_targets_refuse_the_sagemaker_only_flags(tmp_path):
    spot = invoke_in(tmp_path, "train", "--model", "llama2-tiny", "--spot", "--dry-run")
    assert spot.returncode == 2 and "--spot is for --target sagemaker" in spot.stderr
    deadline = invoke_in(tmp_path, "train", "--model", "llama2-tiny", "--max-runtime", "1h", "--dry-run")
    assert deadline.returncode == 0 and json.loads(deadline.stdout)["placement"]["max_runtime"] == 3600  # every target


def test_the_recorded_stack_fills_the_request(tmp_path, monkeypatch):
    """What `make up PROFILE=aws` recorded with sagemaker_enabled: the role, bucket, subnets, security group,
    secret and KMS key of the stack's `sagemaker` output, and the stack's tag, so `infra.audit` finds a job still
    running."""
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))
    stack = {
        "role_arn": "arn:aws:iam::123456789012:role/trainkit-sagemaker-20261125",
        "bucket": "trainkit-runs-123456789012",
        "subnet_ids": ["subnet-0fffffffffffffff1"],
        "security_group_ids": ["sg-0c1a2b3c4d5e6f708"],
        "hf_token_secret_arn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:trainkit-hf-token-AbCdEf",
        "kms_key_arn": "arn:aws:kms:eu-west-1:123456789012:key/0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9",
        "inter_container_traffic_encryption": True,
    }
    save_outputs(
        {"gpu_instance_type": "p5.48xlarge", "region": "eu-west-1", "stack_id": "trainkit-x", "sagemaker": stack}
    )
    body, printed = dry_run(tmp_path, "train", "--model", "llama2-tiny")
    assert problems("sagemaker", "CreateTrainingJob", body) == []
    assert "placeholders" not in printed
    assert body["RoleArn"] == stack["role_arn"] and body["VpcConfig"]["Subnets"] == stack["subnet_ids"]
    assert body["CheckpointConfig"]["S3Uri"].startswith("s3://trainkit-runs-123456789012/checkpoints/")
    assert {"Key": "trainkit:stack-id", "Value": "trainkit-x"} in body["Tags"]
    assert body["Environment"]["TRAINKIT_AWS_REGION"] == "eu-west-1"  # the stack's: the hosts' boto3 clients need one
    # The stack's key on the output; none on the volume of a p5, whose local NVMe storage SageMaker will not take a
    # key for (API reference, ResourceConfig.VolumeKmsKeyId); the stack's choice of inter-container encryption.
    assert body["OutputDataConfig"]["KmsKeyId"] == stack["kms_key_arn"]
    assert "VolumeKmsKeyId" not in body["ResourceConfig"]
    assert body["EnableInterContainerTrafficEncryption"] is True
