"""The Terraform adapter against a real Terraform binary, on built-in resources (no provider, no cloud)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainkit.infra.terraform import TerraformError, TerraformStack

CONFIG = """
terraform {
  backend "local" {}
}

variable "name" {
  type = string
}

resource "terraform_data" "node" {
  count = 2
  input = "${var.name}-${count.index}"
}

output "names" {
  value = terraform_data.node[*].output
}
"""


@pytest.fixture
def stack(tmp_path) -> tuple[TerraformStack, Path]:
    root = tmp_path / "stack"
    root.mkdir()
    (root / "main.tf").write_text(CONFIG)
    var_file = tmp_path / "test.tfvars"
    var_file.write_text('name = "gpu"\n')
    stack = TerraformStack(root, tmp_path / "state")
    stack.init()
    return stack, var_file


def test_plan_apply_outputs_destroy_round_trip(stack):
    tf, var_file = stack
    assert not tf.has_state()
    plan = tf.plan(var_file, stream=False)
    assert plan.changes["create"] == 2 and plan.count("terraform_data") == 2 and plan.has_changes
    assert plan.describe() == "Plan: 2 to create, 0 to update, 0 to delete"
    tf.apply(plan, stream=False)
    assert tf.has_state()
    assert tf.outputs() == {"names": ["gpu-0", "gpu-1"]}
    assert not tf.plan(var_file, stream=False).has_changes
    tf.destroy(var_file, stream=False)
    assert not tf.has_state() and tf.outputs() == {}


def test_failures_raise_with_terraforms_last_line(stack, tmp_path):
    tf, _ = stack
    with pytest.raises(TerraformError, match=r"terraform plan failed \(exit 1\)"):
        tf.plan(None, stream=False)  # the required variable `name` is missing
