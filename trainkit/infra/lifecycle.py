"""The aws profile's `plan` / `up` / `down` / `outputs` / `audit`: the infra stack (cluster, GPU nodes, FSx,
ECR), the idle guard's image when the guard is on, then the platform stack on the cluster; teardown in reverse
order, then an audit by tag."""

from __future__ import annotations

import json
import os
import re
import time

from trainkit.errors import SpecError
from trainkit.infra import aws, guard_image
from trainkit.infra.outputs import IDLE_GUARD_IMAGE_FILE, aws_state_dir, kubeconfig_path, outputs_path, save_outputs
from trainkit.infra.terraform import TerraformError, TerraformStack

# A destroy can end on an error a later attempt does not meet: AWS throttling us or a connection dropped past the
# provider's own retries (aws_max_retries), or a DependencyViolation while something made outside Terraform (a
# load balancer's network interfaces, EKS's security groups) is still going away. `make down` waits and runs the
# destroy again, at most DESTROY_ATTEMPTS times in all; anything else (no access, a bad configuration) stops at once.
TRANSIENT_DESTROY = re.compile(
    r"DependencyViolation|RequestLimitExceeded|Throttling|TooManyRequests|SlowDown|RequestTimeout|"
    r"ServiceUnavailable|InternalError|InternalFailure|exceeded maximum number of attempts|"
    r"use of closed network connection|connection reset|connection refused|i/o timeout|TLS handshake timeout|"
    r"unexpected EOF|timeout while waiting for"
)
DESTROY_ATTEMPTS = 3
DESTROY_WAIT_ENV = "TRAINKIT_DESTROY_RETRY_WAIT_S"
DESTROY_WAIT_S = 60.0
VOLUMES_WAIT_ENV = "TRAINKIT_VOLUMES_WAIT_S"  # how long `down` waits for the platform's etcd volume to go


def _plan_infra(var_file: str | None):
    """Checks that need no Terraform first (tfvars, credentials), then a saved plan of the infra stack."""
    path = aws.resolve_var_file(var_file)
    aws.check_credentials()
    stack = aws.stack()
    stack.init()
    plan = stack.plan(path)
    described = [plan.describe(), aws.describe_gpu_nodes(plan.variables), aws.estimate_cost(plan).describe()]
    return stack, plan, "\n".join(described)


def plan(var_file: str | None = None) -> str:
    return _plan_infra(var_file)[2]


def up(yes: bool, var_file: str | None, which: str = "all") -> str:
    if which in ("all", "infra"):
        stack, plan, summary = _plan_infra(var_file)
        print(summary, flush=True)
        if plan.has_changes:
            aws.confirm("Create these resources (they are billed until `make down PROFILE=aws`)?", yes)
            stack.apply(plan)
    else:
        stack = aws.stack()
        stack.init()
    outputs = stack.outputs()
    if not outputs:
        raise SpecError("the infra stack has no outputs yet: run `make up PROFILE=aws` (both stacks) first")
    save_outputs(outputs)  # what `invoke train --target eks` defaults from (instance type, ECR image)
    kubeconfig = aws.write_kubeconfig(outputs, kubeconfig_path())
    guard_failed = None
    if which in ("all", "platform"):
        # The platform's own image (the etcd issuer's Deployment, and the idle guard's CronJob when it is on): its ECR
        # repository exists now, and the platform stack needs the image (aws.stack passes it). A failed build or
        # push must not leave the GPU nodes without the platform (device plugins, operator, FSx claim): the platform
        # stack goes on with the image recorded before, and `up` fails at the end.
        try:
            print(guard_image.publish_idle_guard(), flush=True)
        except guard_image.GuardImageFailed as error:
            guard_failed = error
            print(f"error: {error}; applying the platform stack all the same", flush=True)
        # Device plugins, training operator, etcd, FSx claim, idle guard (terraform/stacks/platform); its
        # providers (helm, kubernetes, kustomization) come from the registry.
        platform = aws.stack("platform")
        platform.init()
        plan = platform.plan()
        if plan.has_changes:
            platform.apply(plan)
    done = f"cluster {outputs['cluster_name']} is up; kubeconfig: export KUBECONFIG={kubeconfig}"
    if guard_failed:
        print(done, flush=True)
        raise SpecError(f"{guard_failed}: fix that and run `{guard_image.PLATFORM_RETRY}`")
    return done


def down(yes: bool, var_file: str | None) -> str:
    """Destroy in order (platform stack first once it exists, then infra), then audit by tag."""
    path = aws.resolve_var_file(var_file)
    aws.check_credentials()
    stack_id, region, name = aws.stack_identity(path)
    confirmed = False
    for stack_name in aws.teardown_order():
        stack = aws.stack(stack_name)
        if not (stack.state_dir / "terraform.tfstate").is_file():
            continue  # never applied (and its providers need not be installed to know it)
        stack.init()
        if not stack.has_state():
            continue
        if not confirmed:
            aws.confirm(f"Destroy everything in stack {stack_id} (cluster, GPU nodes, FSx data)?", yes)
            confirmed = True
        if stack_name == "infra":
            # Batch jobs and job definitions are not in the state: end them first (a running multi-node job holds
            # its instances and network interfaces), so the destroy and the audit find nothing of theirs.
            for line in aws.release_batch(stack_id, region):
                print(line, flush=True)
        print(f"destroying the {stack_name} stack", flush=True)
        destroy(stack, stack_name, path if stack_name == "infra" else None, path)  # platform reads infra outputs
        if stack_name == "platform":  # its etcd volume goes after its claim, while the cluster's driver still runs
            wait = float(os.environ.get(VOLUMES_WAIT_ENV, aws.VOLUMES_WAIT_S))
            for line in aws.wait_for_platform_volumes(stack_id, region, wait):
                print(line, flush=True)
    leftovers = aws.audit(stack_id, region, name)
    kubeconfig_path().unlink(missing_ok=True)
    outputs_path().unlink(missing_ok=True)
    (aws_state_dir() / IDLE_GUARD_IMAGE_FILE).unlink(missing_ok=True)  # its repository went with the infra stack
    if leftovers:
        raise SpecError("teardown left billable resources behind:\n  " + "\n  ".join(leftovers))
    return f"stack {stack_id} destroyed; audit of {region} found nothing tagged {aws.STACK_TAG}={stack_id}"


def destroy(stack: TerraformStack, name: str, var_file, audit_var_file) -> None:
    """`terraform destroy`, run again after a transient error (TRANSIENT_DESTROY) up to DESTROY_ATTEMPTS times in all;
    when it still fails, say what the stack's state still holds and how to find what is billed."""
    wait = float(os.environ.get(DESTROY_WAIT_ENV, DESTROY_WAIT_S))
    for attempt in range(1, DESTROY_ATTEMPTS + 1):
        try:
            stack.destroy(var_file)
            return
        except TerraformError as error:
            transient = TRANSIENT_DESTROY.search(error.stderr or "")
            if transient is None or attempt == DESTROY_ATTEMPTS:
                raise SpecError(_destroy_failed(stack, name, error, attempt, audit_var_file)) from None
            print(
                f"destroying the {name} stack stopped on a transient error ({transient[0]}); running it again in "
                f"{wait:.0f} s (attempt {attempt + 1} of {DESTROY_ATTEMPTS})",
                flush=True,
            )
            time.sleep(wait)


def _destroy_failed(stack: TerraformStack, name: str, error: TerraformError, attempts: int, var_file) -> str:
    left = stack.resources()
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    if left is None:
        held = f"the {name} stack's state could not be listed (`terraform state list` failed)"
    else:
        shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
        held = f"still in the {name} stack's state ({len(left)}): {shown or 'nothing'}"
    return (
        f"{error}{tries}.\n  {held}\n"
        f"  mend what the error names and run `make down PROFILE=aws` again; `invoke infra.audit --var-file "
        f"{var_file}` lists every resource still tagged for this stack (what is still billed)"
    )


def outputs() -> str:
    stack = aws.stack()
    stack.init()
    return json.dumps(stack.outputs(), indent=2)


def audit(var_file: str | None = None) -> str:
    path = aws.resolve_var_file(var_file)
    aws.check_credentials()
    leftovers = aws.audit(*aws.stack_identity(path))
    if leftovers:
        raise SpecError("resources still tagged for this stack:\n  " + "\n  ".join(leftovers))
    return "audit: nothing left"
