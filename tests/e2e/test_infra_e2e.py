"""`make up PROFILE=aws` / `make down PROFILE=aws` against an AWS emulator (moto server on 127.0.0.1).

The emulator's endpoint and fake credentials come from this test's environment, never from the
product's defaults. moto lacks placement groups, FSx, EKS add-ons, access entries and pod identity:
the root's feature flags switch those off for this run only, and provider retries are set low so
an emulator error fails fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.aws import FAKE_AWS, moto_server
from tests.helpers.paths import REPO

EMULATOR_TFVARS = """
region                = "us-east-1"
availability_zones    = ["us-east-1a", "us-east-1b"]
gpu_availability_zone = "us-east-1a"
name                  = "tk-e2e"
owner                 = "ci@example.com"
stack_id              = "trainkit-e2e"
public_access_cidrs   = ["203.0.113.0/24"]
gpu_instance_type     = "p5.48xlarge"
gpu_desired_nodes     = 1
gpu_max_nodes         = 2

aws_max_retries        = 1
enable_placement_group = false
enable_fsx             = false
enable_eks_addons      = false
enable_access_entries  = false
enable_pod_identity    = false
"""


@pytest.fixture
def emulator(tmp_path):
    with moto_server(tmp_path / "moto.log", {"MOTO_IAM_LOAD_MANAGED_POLICIES": "true"}) as endpoint:
        yield {"AWS_ENDPOINT_URL": endpoint, **FAKE_AWS, "TRAINKIT_STATE_DIR": str(tmp_path / "state")}


def make(target: str, env: dict, var_file: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return subprocess.run(
        [
            "make",
            target,
            "PROFILE=aws",
            f"ARGS=--yes --var-file {var_file}{' --stack infra' if target == 'up' else ''}",
        ],
        cwd=REPO,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_up_then_down_leaves_nothing(emulator, tmp_path):
    var_file = tmp_path / "emulator.tfvars"
    var_file.write_text(EMULATOR_TFVARS)

    up = make("up", emulator, var_file)
    assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
    assert "Estimated cost: $98.32/hour for 1 x p5.48xlarge" in up.stdout
    kubeconfig = Path(emulator["TRAINKIT_STATE_DIR"]) / "aws" / "kubeconfig"
    config = json.loads(kubeconfig.read_text())
    assert config["current-context"] == "tk-e2e"
    assert config["users"][0]["user"]["exec"]["args"][:4] == ["eks", "get-token", "--cluster-name", "tk-e2e"]
    assert f"export KUBECONFIG={kubeconfig}" in up.stdout

    outputs = subprocess.run(
        [str(Path(sys.executable).parent / "invoke"), "infra.outputs"],
        cwd=REPO,
        env={**os.environ, **emulator},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert outputs.returncode == 0, outputs.stderr
    values = json.loads(outputs.stdout)
    assert values["cluster_name"] == "tk-e2e" and values["efa_interfaces_per_node"] == 32
    assert set(values["ecr_repository_urls"]) == {"train", "data-prep"}

    down = make("down", emulator, var_file)
    assert down.returncode == 0, down.stdout[-4000:] + down.stderr[-4000:]
    assert "audit of us-east-1 found nothing tagged trainkit:stack-id=trainkit-e2e" in down.stdout
    assert not kubeconfig.exists()
