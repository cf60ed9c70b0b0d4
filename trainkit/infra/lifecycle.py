"""The aws profile's `plan` / `up` / `down` / `outputs` / `audit`: the infra stack (cluster, GPU nodes, FSx,
ECR), then the platform stack on the cluster; teardown in reverse order, then an audit by tag."""

from __future__ import annotations

import json

from ..cluster import kubeconfig_path, outputs_path, save_outputs
from ..errors import SpecError
from . import aws


def _plan_infra(var_file: str | None):
    """Checks that need no Terraform first (tfvars, credentials), then a saved plan of the infra stack."""
    path = aws.resolve_var_file(var_file)
    aws.check_credentials()
    stack = aws.stack()
    stack.init()
    plan = stack.plan(path)
    return stack, plan, f"{plan.describe()}\n{aws.estimate_cost(plan).describe()}"


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
    if which in ("all", "platform"):
        # Device plugins, training operator, etcd, FSx claim (terraform/stacks/platform); its
        # providers (helm, kubernetes, kustomization) come from the registry.
        platform = aws.stack("platform")
        platform.init()
        plan = platform.plan()
        if plan.has_changes:
            platform.apply(plan)
    return f"cluster {outputs['cluster_name']} is up; kubeconfig: export KUBECONFIG={kubeconfig}"


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
        print(f"destroying the {stack_name} stack", flush=True)
        stack.destroy(path if stack_name == "infra" else None)  # the platform stack reads infra outputs
    leftovers = aws.audit(stack_id, region, name)
    kubeconfig_path().unlink(missing_ok=True)
    outputs_path().unlink(missing_ok=True)
    if leftovers:
        raise SpecError("teardown left billable resources behind:\n  " + "\n  ".join(leftovers))
    return f"stack {stack_id} destroyed; audit of {region} found nothing tagged {aws.STACK_TAG}={stack_id}"


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
