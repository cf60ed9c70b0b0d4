"""What the planned job costs (issue 55): its instances at today's price for its target and region (the AWS Price
List API with credentials, else the shipped table, trainkit/plan/prices.py), the stack's standing costs beside them, and
for EKS and Batch the Capacity Block that would hold the job's nodes for an epoch."""

from __future__ import annotations

from dataclasses import dataclass, field

from training.spec import Job
from trainkit.errors import SpecError
from trainkit.plan.prices import CapacityBlock, Price, PriceBook, Standing, plan_region

FSX_DEFAULTS = (2400, 250)
"""The infra stack's FSx size (GiB) and throughput (MB/s/TiB) when no stack is recorded: the defaults of
fsx_storage_capacity_gib and fsx_throughput_per_tib in terraform/stacks/infra/variables.tf (a test holds them)."""
SPOT_NOTE = (
    "--spot: managed spot training is billed at the training price for the seconds SageMaker counts as billable, which "
    "spot lowers; no discount is guessed here: after a run `invoke status` shows TrainingTimeInSeconds, "
    "BillableTimeInSeconds and the saving, 1 - billable / training"
)


@dataclass
class Cost:
    price: Price | None
    """An instance-hour on the job's target (None: no price known)."""
    usd_per_hour: float | None
    usd_per_epoch: float | None
    target: str
    standing: list[Standing] = field(default_factory=list)
    capacity_block: CapacityBlock | str | None = None
    """For EKS and Batch: the cheapest offering, or why none is shown."""
    notes: list[str] = field(default_factory=list)

    @property
    def source(self) -> str:
        return self.price.source if self.price else "no price known; pass --price-per-hour"


def price_job(job: Job, price_per_hour: float | None, epoch_tokens: int, tokens_per_s: float, book=None) -> Cost:
    """The job's cost at `tokens_per_s`. A plan for the local target is priced as EKS nodes (the AWS default)."""
    from trainkit.infra.outputs import load_outputs

    if job.placement.spot and job.placement.target != "sagemaker":
        raise SpecError("--spot prices SageMaker's managed spot training: add --target sagemaker, or drop --spot")
    infra = load_outputs()
    target = job.placement.target if job.placement.target != "local" else "eks"
    book = book or PriceBook(plan_region(infra.region))
    kind, nodes = str(job.placement.instance_type), job.parallelism.nodes
    if price_per_hour:
        price = Price(price_per_hour, "hour", "--price-per-hour")
    else:
        price = book.instance_hour(target, kind)
    epoch_hours = epoch_tokens / tokens_per_s / 3600
    usd_per_hour = price.usd * nodes if price else None
    cost = Cost(price, usd_per_hour, usd_per_hour * epoch_hours if usd_per_hour else None, target)
    gib, per_tib = infra.fsx_capacity_gib or FSX_DEFAULTS[0], infra.fsx_throughput_per_tib or FSX_DEFAULTS[1]
    if infra.recorded and not infra.fsx_file_system_id:
        gib = None  # the recorded stack has no FSx (enable_fsx = false)
    cost.standing = book.standing(gib, per_tib)
    if target in ("eks", "batch"):
        cost.capacity_block = book.capacity_block(kind, nodes, epoch_hours)
    if target == "sagemaker" and job.placement.spot:
        cost.notes.append(SPOT_NOTE)
    if job.placement.target == "local":
        cost.notes.append("priced as EKS nodes: give --target sagemaker or batch for theirs")
    cost.notes += book.notes
    return cost


def cost_lines(cost: Cost, nodes: int, kind: str, epoch_tokens: int) -> list[str]:
    """The plan's cost section."""
    if cost.usd_per_hour is None:
        return [f"  cost                {cost.source}"]
    shown = f"ml.{kind}" if cost.target == "sagemaker" else kind
    lines = [
        f"  cost on {cost.target} ({cost.source}; at the compute rate)",
        f"    $ per hour        {cost.usd_per_hour:,.2f} ({nodes} x {shown} at ${cost.price.usd:,.2f})",
        f"    $ per epoch       {cost.usd_per_epoch:,.2f} (epoch = {epoch_tokens:,} tokens; set --epoch-tokens)",
    ]
    if cost.standing:
        total = sum(s.usd_per_hour for s in cost.standing)
        lines.append(f"    standing          {total:,.3f} $/hour while the stack is up, whatever runs:")
        lines += [f"      {s.usd_per_hour:8,.3f}  {s.what} ({s.source})" for s in cost.standing]
    block = cost.capacity_block
    if isinstance(block, CapacityBlock):
        lines.append(
            f"    capacity block    {block.count} x {block.instance_type} for {block.hours} h from {block.start} "
            f"({block.zone}): ${block.upfront_usd:,.2f} upfront, ${block.per_instance_hour:,.2f} per instance-hour "
            f"({block.source})"
        )
    elif block:
        lines.append(f"    capacity block    {block}")
    lines += [f"    note: {note}" for note in cost.notes]
    return lines
