"""Bad input through the real command line: exit code 2, a message naming the flag, nothing created."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers.product import invoke
from training.vision.synthetic import SyntheticTree, write_tree


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model", "llama3-8b"], "--model 'llama3-8b' is not a known model; choose one of:"),
        (["--steps=-5"], "--steps must be a positive integer (got -5)"),
        (["--global-batch-size", "12", "--micro-batch-size", "8"], "--global-batch-size 12 is not divisible"),
        (["--nproc", "999"], "--nproc 999 x --nodes 1 needs 999 processes but this machine has"),
        (["--dataset", "missing/file.jsonl"], "--dataset missing/file.jsonl does not exist"),
        (["--profile", "gcp"], "--profile 'gcp' does not exist; choose one of: aws, local"),
        (["--model", "resnet-tiny", "--data", "no/such/dir"], "--data no/such/dir does not exist; create one with"),
        (["--model", "resnet-tiny", "--data", "tests", "--dataset", "x"], "--data is an alias of --dataset"),
        (["--model", "resnet-tiny", "--seq-len", "64"], "--seq-len applies to language models, not to resnet-tiny"),
    ],
)
def test_bad_flags_fail_fast_and_create_nothing(flags, message, tmp_path):
    result = invoke("train", "--runs-dir", str(tmp_path / "runs"), *flags)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert not (tmp_path / "runs").exists()


def test_missing_token_for_pretrained_weights_says_where_to_put_one(tmp_path):
    env = {"HF_TOKEN": "", "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN_PATH": ""}
    result = invoke("train", "--model", "llama2-7b", "--init", "pretrained", "--runs-dir", str(tmp_path / "r"), env=env)
    assert result.returncode == 2
    assert "needs an access token: set HF_TOKEN" in result.stderr and "meta-llama/Llama-2-7b-hf" in result.stderr
    assert not (tmp_path / "r").exists()


def test_token_file_that_does_not_exist(tmp_path):
    result = invoke(
        "train",
        "--model",
        "llama2-7b",
        "--init",
        "pretrained",
        "--hf-token-file",
        str(tmp_path / "nope"),
        "--runs-dir",
        str(tmp_path / "r"),
        env={"HF_TOKEN": ""},
    )
    assert result.returncode == 2 and "--hf-token-file" in result.stderr and "does not exist" in result.stderr


def test_infra_plan_without_aws_credentials_is_one_clear_sentence(tmp_path):
    env = {
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "TRAINKIT_STATE_DIR": str(tmp_path / "state"),
    }
    example = "terraform/stacks/infra/terraform.tfvars.example"
    result = invoke("infra.plan", "--var-file", example, env=env, drop_env_prefix="AWS_")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: no AWS credentials found: set AWS_PROFILE (e.g. after `aws sso login`) or "
        "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, then run this again"
    ]
    assert "Traceback" not in result.stdout + result.stderr


def test_missing_tfvars_says_to_copy_the_example(tmp_path):
    result = invoke("infra.up", "--profile", "aws", "--var-file", str(tmp_path / "nope.tfvars"))
    assert result.returncode == 2 and "copy terraform/stacks/infra/terraform.tfvars.example" in result.stderr


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("no-train", "has no train/ folder; expected train/<class>/*.JPEG and val/<class>/*.JPEG"),
        ("empty-class", "n00000001 has no images"),
        ("flat-val", "images outside class folders (the ILSVRC layout)"),
    ],
)
def test_a_bad_image_tree_fails_fast_and_creates_nothing(damage, message, tmp_path):
    tree = write_tree(
        tmp_path / "data", SyntheticTree(classes=3, per_class=2, val_per_class=1, flat_val=damage == "flat-val")
    )
    if damage == "no-train":
        shutil.rmtree(tree / "train")
    elif damage == "empty-class":
        for image in (tree / "train" / "n00000001").iterdir():
            image.unlink()
    result = invoke("train", "--model", "resnet-tiny", "--data", str(tree), "--runs-dir", str(tmp_path / "runs"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert not (tmp_path / "runs").exists()
