"""`make down`'s destroy (trainkit/infra/lifecycle.py): run again after a transient error, at most three times in
all, and a destroy that still fails names what the stack's state holds and how to audit what is billed."""

from __future__ import annotations

import pytest

from trainkit.errors import SpecError
from trainkit.infra import lifecycle
from trainkit.infra.terraform import TerraformError

DEPENDENCY = """
Error: deleting EC2 Subnet (subnet-0a1b2c): operation error EC2: DeleteSubnet, https response error StatusCode: 400,
RequestID: 1, api error DependencyViolation: The subnet 'subnet-0a1b2c' has dependencies and cannot be deleted.

  with module.network.aws_subnet.private["us-east-1a"],
  on ../../modules/network/main.tf line 40, in resource "aws_subnet" "private":
"""
DROPPED = """
Error: waiting for EC2 VPC Endpoint (vpce-1) delete: operation error EC2: DescribeVpcEndpoints, exceeded maximum
number of attempts, 25, https response error: read tcp 127.0.0.1:5 -> 127.0.0.1:6: use of closed network connection
"""
DENIED = """
Error: deleting EKS Cluster (tk): operation error EKS: DeleteCluster, https response error StatusCode: 403,
api error AccessDeniedException: User is not authorized to perform: eks:DeleteCluster
"""


class Stack:
    """A stack whose destroys end with the given stderr texts in turn (None: it succeeds)."""

    def __init__(self, *outcomes: str | None, left: tuple[str, ...] | None = ()):
        self.outcomes, self.left, self.calls = list(outcomes), None if left is None else list(left), 0

    def destroy(self, var_file) -> None:
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            raise TerraformError("destroy", 1, outcome)

    def resources(self) -> list[str] | None:
        return self.left


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    monkeypatch.setenv(lifecycle.DESTROY_WAIT_ENV, "0")


@pytest.mark.parametrize("error", [DEPENDENCY, DROPPED])
def test_a_transient_error_is_waited_out_and_the_destroy_run_again(error, capsys):
    stack = Stack(error, None)
    lifecycle.destroy(stack, "infra", "f.tfvars", "f.tfvars")
    assert stack.calls == 2
    assert "stopped on a transient error" in capsys.readouterr().out


def test_a_destroy_that_keeps_failing_stops_after_three_and_names_what_is_left():
    left = tuple(f"module.network.aws_subnet.private[{i}]" for i in range(10))
    stack = Stack(DEPENDENCY, DEPENDENCY, DEPENDENCY, None, left=left)
    with pytest.raises(SpecError) as refused:
        lifecycle.destroy(stack, "infra", "f.tfvars", "stacks/infra/f.tfvars")
    message = str(refused.value)
    assert stack.calls == lifecycle.DESTROY_ATTEMPTS == 3
    assert message.startswith("terraform destroy failed (exit 1): Error: deleting EC2 Subnet (subnet-0a1b2c)")
    assert "after 3 attempts" in message and "(10): module.network.aws_subnet.private[0]" in message
    assert "and 2 more" in message and "`invoke infra.audit --var-file stacks/infra/f.tfvars`" in message


def test_an_error_a_retry_cannot_mend_stops_at_once():
    stack = Stack(DENIED, None, left=("module.eks.aws_eks_cluster.this",))
    with pytest.raises(SpecError) as refused:
        lifecycle.destroy(stack, "infra", None, "f.tfvars")
    assert stack.calls == 1
    assert "Error: deleting EKS Cluster (tk)" in str(refused.value) and "attempts" not in str(refused.value)
    assert "(1): module.eks.aws_eks_cluster.this" in str(refused.value)


def test_a_state_that_cannot_be_listed_is_not_called_empty():
    stack = Stack(DENIED, left=None)  # `terraform state list` failed too (the backend is unreachable)
    with pytest.raises(SpecError) as refused:
        lifecycle.destroy(stack, "infra", None, "f.tfvars")
    assert "the infra stack's state could not be listed" in str(refused.value)
    assert "nothing" not in str(refused.value)


def test_make_down_forgets_the_idle_guards_image_with_its_repository(recorded_outputs, monkeypatch):
    """The guard's repository goes with the infra stack (force_delete): a later stack of the same name must not be
    handed an image that no longer exists (its CronJob would never pull it)."""
    from trainkit.infra import aws, outputs

    record = outputs.aws_state_dir() / outputs.IDLE_GUARD_IMAGE_FILE
    record.write_text('{"image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainkit/idle-guard:guard-abc"}\n')
    monkeypatch.setattr(aws, "resolve_var_file", lambda var_file: "f.tfvars")
    monkeypatch.setattr(aws, "check_credentials", dict)
    monkeypatch.setattr(aws, "stack_identity", lambda path: ("trainkit", "us-east-1", "trainkit"))
    monkeypatch.setattr(aws, "teardown_order", list)  # both stacks already destroyed
    monkeypatch.setattr(aws, "audit", lambda stack_id, region, name: [])
    assert lifecycle.down(yes=True, var_file=None).startswith("stack trainkit destroyed")
    assert not record.exists() and not outputs.outputs_path().exists()
