"""The idle guard's AWS identity (terraform/modules/gpu-nodegroup), read from the HCL as python-hcl2 parses it: its
role's only write is UpdateNodegroupConfig on the module's node groups, and the node group ignores drift in its
desired size, so the next `make up` does not undo the guard. terraform test of the module applies the same policy
against a mock provider (terraform/modules/gpu-nodegroup/tests/gpu_nodegroup.tftest.hcl, run by
tests/integration/test_terraform.py)."""

from __future__ import annotations

import hcl2

from tests.helpers.paths import REPO
from tests.helpers.platform_stack import unquote

MODULE = REPO / "terraform" / "modules" / "gpu-nodegroup"
NODE_GROUP_ARNS = "${[for ng in aws_eks_node_group.this : ng.arn]}"
READS = ("Describe", "List", "Get")


def _plain(value):
    """python-hcl2's parse without its quotes and markers."""
    if isinstance(value, dict):
        return {unquote(k): _plain(v) for k, v in value.items() if not k.startswith("__")}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return unquote(value)


def _load(name: str) -> dict:
    with (MODULE / name).open() as handle:
        return _plain(hcl2.load(handle))


def _main() -> dict:
    return _load("main.tf")


def _block(parsed: dict, kind: str, type_name: str, name: str) -> dict:
    for block in parsed.get(kind, []):
        if name in block.get(type_name, {}):
            return block[type_name][name]
    raise AssertionError(f"no {kind} {type_name}.{name} in {MODULE / 'main.tf'}")


def test_the_guard_may_only_scale_its_own_node_group():
    policy = _block(_main(), "data", "aws_iam_policy_document", "idle_guard")
    statements = policy["statement"]
    actions = [action for statement in statements for action in statement["actions"]]
    writes = [action for action in actions if not action.split(":")[1].startswith(READS)]
    assert writes == ["eks:UpdateNodegroupConfig"]
    assert set(actions) == {"eks:DescribeNodegroup", "eks:UpdateNodegroupConfig"}
    for statement in statements:
        assert statement["resources"] == NODE_GROUP_ARNS, statement  # no "*", no other resource
        assert "not_actions" not in statement and "condition" not in statement
        assert statement.get("effect", "Allow") == "Allow"


def test_the_role_is_for_pods_and_only_the_guards_service_account():
    parsed = _main()
    assume = _block(parsed, "data", "aws_iam_policy_document", "idle_guard_assume")["statement"][0]
    assert assume["principals"][0]["identifiers"] == ["pods.eks.amazonaws.com"]
    association = _block(parsed, "resource", "aws_eks_pod_identity_association", "idle_guard")
    assert association["service_account"] == "${var.idle_guard.service_account}"
    assert association["role_arn"] == "${aws_iam_role.idle_guard[0].arn}"
    attached = [body for body in parsed["resource"] if "aws_iam_role_policy_attachment" in body]
    assert not attached, "the guard's role gets its inline policy only"


def test_desired_size_drift_is_ignored_and_min_size_may_be_zero():
    node_group = _block(_main(), "resource", "aws_eks_node_group", "this")
    assert node_group["lifecycle"][0]["ignore_changes"] == ["${scaling_config[0].desired_size}"]
    variables = {name: body for block in _load("variables.tf")["variable"] for name, body in block.items()}
    assert "min_size = optional(number, 0)" in variables["node_groups"]["type"]
    assert "min_size <= ng.desired_size" in str(variables["node_groups"]["validation"])  # 0 <= desired allowed
