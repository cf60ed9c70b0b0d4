"""Terraform, offline: fmt, init from the local provider mirror, validate, and `terraform test` with mocks."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from trainkit.infra.cli_config import write_cli_config

TERRAFORM = REPO / "terraform"
# The platform root's providers (helm, kubernetes, kustomization) are not in this machine's mirror:
# it is checked by tests/unit/test_platform_stack.py and tests/integration/test_platform_stack_objects.py, and
# validated where the registry is reachable.
ONLINE_ONLY = {Path("stacks/platform")}
ROOTS = sorted(
    [p.relative_to(TERRAFORM) for p in (TERRAFORM / "modules").iterdir() if p.is_dir()]
    + [p.relative_to(TERRAFORM) for p in (TERRAFORM / "stacks").iterdir() if p.is_dir()]
)
ROOTS = [root for root in ROOTS if root not in ONLINE_ONLY]


@pytest.fixture(scope="session")
def tf(tmp_path_factory):
    binary = shutil.which("terraform")
    assert binary, "terraform is not installed: install Terraform >= 1.9 (this suite runs it offline)"
    state = tmp_path_factory.mktemp("tf")
    env = {**os.environ, "TF_CLI_CONFIG_FILE": str(write_cli_config(state)), "TF_IN_AUTOMATION": "1"}

    def run(directory: Path, *args: str) -> subprocess.CompletedProcess:
        data_dir = state / str(directory).replace("/", "_")
        return subprocess.run(
            [binary, *args],
            cwd=TERRAFORM / directory,
            env={**env, "TF_DATA_DIR": str(data_dir)},
            capture_output=True,
            text=True,
            timeout=300,
        )

    return run


def test_fmt(tf):
    result = tf(Path("."), "fmt", "-check", "-recursive", "-diff")
    assert result.returncode == 0, f"run `terraform fmt -recursive terraform/`:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("root", ROOTS, ids=str)
def test_init_validate_and_test(tf, root):
    init = tf(root, "init", "-backend=false", "-input=false", "-no-color")
    assert init.returncode == 0, init.stdout + init.stderr
    validate = tf(root, "validate", "-no-color")
    assert validate.returncode == 0, validate.stdout + validate.stderr
    if (TERRAFORM / root / "tests").is_dir():
        test = tf(root, "test", "-no-color")
        assert test.returncode == 0, test.stdout + test.stderr
        assert " 0 failed" in test.stdout and "passed" in test.stdout
