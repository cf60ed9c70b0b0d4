"""The idle guard's AWS identity (terraform/modules/gpu-nodegroup), read from the HCL as python-hcl2 parses it: its
role's only write is UpdateNodegroupConfig on the module's node groups, only EKS acting for this account may assume
it and only for the guard's service account in this cluster, and the node group ignores drift in its desired size,
so the next `make up` does not undo the guard. Every other Pod Identity role in terraform/ is held to the same trust.
terraform test of the module applies the same policy against a mock provider
(terraform/modules/gpu-nodegroup/tests/gpu_nodegroup.tftest.hcl, run by tests/integration/test_terraform.py)."""

from __future__ import annotations

from functools import cache

import hcl2

from tests.helpers.paths import REPO
from tests.helpers.platform_stack import unquote

MODULE = REPO / "terraform" / "modules" / "gpu-nodegroup"
NODE_GROUP_ARNS = "${[for ng in aws_eks_node_group.this : ng.arn]}"
READS = ("Describe", "List", "Get")
POD_IDENTITY = "pods.eks.amazonaws.com"
# What a Pod Identity trust statement must pin, each as StringEquals: the account EKS acts for (confused deputy; IAM
# User Guide, "The confused deputy problem") and the session tags Pod Identity sends, which name the cluster, namespace
# and service account (EKS User Guide, "Create IAM role with trust policy required by EKS Pod Identity").
POD_IDENTITY_KEYS = (
    "aws:SourceAccount",
    "aws:RequestTag/eks-cluster-arn",
    "aws:RequestTag/kubernetes-namespace",
    "aws:RequestTag/kubernetes-service-account",
)


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


def unpinned(statement: dict) -> list[str]:
    """The keys of POD_IDENTITY_KEYS a trust statement does not check with StringEquals."""
    checked = {c["variable"] for c in statement.get("condition", []) if c["test"] == "StringEquals"}
    return [key for key in POD_IDENTITY_KEYS if key not in checked]


@cache
def pod_identity_trusts() -> dict[str, dict]:
    """Every policy statement under terraform/ that trusts pods.eks.amazonaws.com, by "<folder>/<document>"."""
    found = {}
    for path in sorted((REPO / "terraform").rglob("*.tf")):
        if ".terraform" in path.parts:
            continue
        with path.open() as handle:
            parsed = _plain(hcl2.load(handle))
        for block in parsed.get("data", []):
            for name, document in block.get("aws_iam_policy_document", {}).items():
                for statement in document.get("statement", []):
                    if any(POD_IDENTITY in p["identifiers"] for p in statement.get("principals", [])):
                        found[f"{path.parent.name}/{name}"] = statement
    return found


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
    (assume,) = _block(parsed, "data", "aws_iam_policy_document", "idle_guard_assume")["statement"]
    assert assume["principals"] == [{"type": "Service", "identifiers": [POD_IDENTITY]}]
    assert assume["actions"] == ["sts:AssumeRole", "sts:TagSession"]
    association = _block(parsed, "resource", "aws_eks_pod_identity_association", "idle_guard")
    assert association["service_account"] == "${var.idle_guard.service_account}"
    assert association["role_arn"] == "${aws_iam_role.idle_guard[0].arn}"
    assert unpinned(assume) == []
    pinned = {c["variable"]: c["values"] for c in assume["condition"]}
    assert pinned["aws:RequestTag/kubernetes-namespace"] == [association["namespace"]]
    assert pinned["aws:RequestTag/kubernetes-service-account"] == [association["service_account"]]
    assert pinned["aws:SourceAccount"] == ["${local.account}"]
    assert pinned["aws:RequestTag/eks-cluster-arn"] == ["${local.cluster_arn}"]
    module_locals = {k: v for block in parsed["locals"] for k, v in block.items()}
    assert module_locals["account"] == "${data.aws_caller_identity.current.account_id}"
    assert module_locals["cluster_arn"].endswith(":${local.account}:cluster/${var.cluster_name}")
    assert association["cluster_name"] == "${var.cluster_name}"
    assert "disable_session_tags" not in association  # without the session tags no one could assume the role
    attached = [body for body in parsed["resource"] if "aws_iam_role_policy_attachment" in body]
    assert not attached, "the guard's role gets its inline policy only"


def test_desired_size_drift_is_ignored_and_min_size_may_be_zero():
    node_group = _block(_main(), "resource", "aws_eks_node_group", "this")
    assert node_group["lifecycle"][0]["ignore_changes"] == ["${scaling_config[0].desired_size}"]
    variables = {name: body for block in _load("variables.tf")["variable"] for name, body in block.items()}
    assert "min_size = optional(number, 0)" in variables["node_groups"]["type"]
    assert "min_size <= ng.desired_size" in str(variables["node_groups"]["validation"])  # 0 <= desired allowed


def test_every_pod_identity_role_trusts_only_its_account_cluster_and_service_account():
    trusts = pod_identity_trusts()
    assert sorted(trusts) == ["eks/pod_identity_assume", "gpu-nodegroup/idle_guard_assume"]
    assert {name: unpinned(statement) for name, statement in trusts.items()} == {name: [] for name in trusts}


def test_the_eks_modules_roles_are_each_for_the_service_account_of_their_association():
    """terraform/modules/eks: one trust document per Pod Identity (FSx CSI controller, data job), each pinned to the
    namespace and service account its association names, from one local."""
    with (REPO / "terraform" / "modules" / "eks" / "main.tf").open() as handle:
        parsed = _plain(hcl2.load(handle))
    pinned = {c["variable"]: c["values"] for c in pod_identity_trusts()["eks/pod_identity_assume"]["condition"]}
    assert pinned["aws:RequestTag/eks-cluster-arn"] == ["${aws_eks_cluster.this[0].arn}"]
    assert pinned["aws:RequestTag/kubernetes-namespace"] == ["${each.value.namespace}"]
    assert pinned["aws:RequestTag/kubernetes-service-account"] == ["${each.value.service_account}"]
    for name in ("fsx_csi", "data_reader"):
        association = _block(parsed, "resource", "aws_eks_pod_identity_association", name)
        assert association["namespace"] == f"${{local.pod_identities.{name}.namespace}}"
        assert association["service_account"] == f"${{local.pod_identities.{name}.service_account}}"
        role = _block(parsed, "resource", "aws_iam_role", name)
        assert role["assume_role_policy"] == f'${{data.aws_iam_policy_document.pod_identity_assume["{name}"].json}}'


def test_the_check_refuses_a_trust_policy_without_its_conditions():
    statement = pod_identity_trusts()["gpu-nodegroup/idle_guard_assume"]
    assert unpinned({k: v for k, v in statement.items() if k != "condition"}) == list(POD_IDENTITY_KEYS)
    conditions = [c for c in statement["condition"] if c["variable"] != "aws:SourceAccount"]
    assert unpinned({**statement, "condition": conditions}) == ["aws:SourceAccount"]
    loosened = [{**c, "test": "StringLike"} for c in statement["condition"]]
    assert unpinned({**statement, "condition": loosened}) == list(POD_IDENTITY_KEYS)
