"""`invoke infra.*`: bring a profile up and down (local: this machine's servers; aws: Terraform stacks)."""

from __future__ import annotations

from invoke import Collection

from trainkit.cli.options import task, user_errors
from trainkit.errors import SpecError

PROFILES = ("local", "aws")
STACKS = ("all", "infra", "platform")
HELP = {
    "profile": "local (this machine) or aws (Terraform infra stack, then the platform stack).",
    "yes": "Do not ask for confirmation (aws).",
    "var-file": "tfvars for the infra stack (default terraform/stacks/infra/terraform.tfvars).",
}


def _aws(profile: str) -> bool:
    if profile not in PROFILES:
        raise SpecError(f"--profile {profile!r} is not valid here; choose one of: {', '.join(PROFILES)}")
    return profile == "aws"


@task(
    help={
        **HELP,
        "stack": "aws: all (default), infra (cluster, nodes, FSx, ECR) or platform (the idle guard's image when the "
        "guard is on, then the platform on the cluster).",
    }
)
@user_errors
def up(c, profile="local", yes=False, var_file=None, stack="all"):
    """Bring up a profile. aws: plan, cost per hour, confirm, apply infra, write a kubeconfig, build and push the idle
    guard's image (when the guard is on), apply the platform."""
    from trainkit.infra import lifecycle, local

    if stack not in STACKS:
        raise SpecError(f"--stack {stack!r} is not valid; choose one of: {', '.join(STACKS)}")
    print(lifecycle.up(yes, var_file, stack) if _aws(profile) else local.up())


@task(help=HELP)
@user_errors
def down(c, profile="local", yes=False, var_file=None):
    """Take a profile down. aws: destroy in order, then audit that nothing tagged is left (exit 2 if so)."""
    from trainkit.infra import lifecycle, local

    print(lifecycle.down(yes, var_file) if _aws(profile) else local.down())


@task(name="plan", help={"var-file": HELP["var-file"]})
@user_errors
def plan(c, var_file=None):
    """Show what `infra.up --profile aws` would create and its GPU cost per hour. Changes nothing."""
    from trainkit.infra import lifecycle

    print(lifecycle.plan(var_file))


@task
@user_errors
def outputs(c):
    """Print the infra stack's outputs (cluster, FSx, ECR, GPU shape) as JSON."""
    from trainkit.infra import lifecycle

    print(lifecycle.outputs())


@task(help={"var-file": HELP["var-file"]})
@user_errors
def audit(c, var_file=None):
    """List AWS resources still tagged with the stack id; exit 2 when any are left."""
    from trainkit.infra import lifecycle

    print(lifecycle.audit(var_file))


@task(
    help={
        "region": "The region to price (default: the infra stack's, else AWS_REGION, else us-east-1).",
        "refresh-table": "Rewrite trainkit/tables/prices.json from the price list API (needs AWS credentials).",
        "output": "With --refresh-table: write here instead of the shipped table.",
    }
)
@user_errors
def prices(c, region=None, refresh_table=False, output=None):
    """Today's prices as `invoke plan` and `make up` use them, each with its source (the AWS Price List API with
    credentials, else the shipped table); --refresh-table rewrites that table from the API."""
    from pathlib import Path

    from trainkit.infra.outputs import load_outputs
    from trainkit.plan.price_table import price_rows, refreshed_table, write_table
    from trainkit.plan.prices import PriceBook, plan_region

    book = PriceBook(region or plan_region(load_outputs().region))
    if refresh_table:
        path = write_table(refreshed_table(book), Path(output) if output else None)
        print(f"wrote {path}: the price list API's prices in {book.region} on {book.today}")
        return
    labels = {
        "ec2_hour": "{} (EC2 on demand: EKS, Batch)",
        "sagemaker_training_hour": "{} (SageMaker training)",
        "fsx_lustre_persistent_2_gb_month": "FSx for Lustre Persistent-2, {} MB/s/TiB",
    }
    for key, row in price_rows(book).items():
        for what, price in row.items():
            print(f"{labels.get(key, '{}').format(what):52} {price if price else 'no price known'}")
    for note in book.notes:
        print(f"note: {note}")


collection = Collection("infra", up, down, plan, outputs, audit, prices)
