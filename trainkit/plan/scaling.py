"""A job's scaling across node counts and sharding strategies (`invoke plan --scaling`): the scaling model's
curves (scaling_model.py) from the one-node memory plan (memory.py), the strategy it would choose at each size, as
a table, JSON and a PNG; and the predictions the run report draws beside what a run measured."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from training.families import family_of
from training.spec import Job
from trainkit.errors import SpecError
from trainkit.hardware import INSTANCE_TYPES
from trainkit.job.models import get_model
from trainkit.plan import scaling_model as scaling
from trainkit.plan.memory import USABLE_FRACTION, Plan, PlanOptions, make_plan, memory_per_gpu, step_cost


@dataclass
class ScalingPlan:
    """The scaling model's predictions for one job (trainkit/plan/scaling_model.py): every strategy at every node count,
    from the one-node plan's per-GPU batch (weak scaling), with memory fits and the strategy it would choose."""

    plan: Plan
    fabric: scaling.Fabric
    workload: scaling.StepCost
    curves: dict[str, list[scaling.Point]]
    fits: dict[str, dict[int, bool]]
    chosen: dict[int, str | None]

    def tokens_per_s(self, point: scaling.Point) -> float:
        plan = self.plan
        per_gpu = plan.job.optimisation.micro_batch_size * self.workload.micro_batches * plan.job.data.seq_len
        return per_gpu * plan.job.parallelism.nproc * point.nodes / point.step_s


def make_scaling(job: Job, options: PlanOptions | None = None, node_counts=scaling.NODE_COUNTS) -> ScalingPlan:
    """Predictions on 1..64 nodes for each strategy. The per-GPU batch is the one-node plan's: a given
    --global-batch-size is the job's at its --nodes, so one node's share of it is planned."""
    job = copy.deepcopy(job)
    nodes, o = job.parallelism.nodes, job.optimisation
    if o.global_batch_size and o.global_batch_size % nodes:
        raise SpecError(
            f"--global-batch-size {o.global_batch_size} does not split over --nodes {nodes}; the scaling plan keeps "
            "each GPU's batch, so give a multiple of the node count"
        )
    if o.global_batch_size:
        o.global_batch_size //= nodes
    job.parallelism.nodes, job.parallelism.min_nodes = 1, None
    plan = make_plan(job, replace(options, priced=False))
    gpus = plan.job.parallelism.nproc
    fabric = replace(scaling.fabric_for(plan.job.placement.instance_type), per_node=gpus)
    workload = step_cost(plan)
    strategies = list(plan.memory_per_gpu)  # the family's: FSDP2's four, or ZeRO-1 and DDP
    fits = {
        name: {
            n: memory_per_gpu(plan.job, name, n * gpus).total <= USABLE_FRACTION * plan.gpu_memory_bytes
            for n in node_counts
        }
        for name in strategies
    }
    curves = {}
    for name in strategies:  # efficiency against the smallest size that fits (70B needs several nodes)
        smallest = next((n for n in node_counts if fits[name][n]), node_counts[0])
        curves[name] = scaling.curve(workload, name, fabric, node_counts, base_nodes=smallest)
    chosen = {}
    for index, n in enumerate(node_counts):
        fitting = [name for name in strategies if fits[name][n]]
        chosen[n] = min(fitting, key=lambda name: curves[name][index].step_s) if fitting else None
    return ScalingPlan(plan, fabric, workload, curves, fits, chosen)


def render_scaling(result: ScalingPlan) -> str:
    plan, job = result.plan, result.plan.job
    nodes = [point.nodes for point in next(iter(result.curves.values()))]
    lines = [
        f"Scaling: {job.model.name} on 1..{nodes[-1]} x {job.placement.instance_type} ({result.fabric.source})",
        f"  per GPU and step: micro batch {job.optimisation.micro_batch_size} x {result.workload.micro_batches} "
        f"accumulation x seq {job.data.seq_len} (weak scaling: the global batch grows with the nodes)",
        f"  compute {result.workload.compute_s:.2f} s per step at MFU {plan.options.mfu:.1%} "
        f"({plan.options.mfu_source})",
        f"  collectives: {result.fabric.inter_efficiency:.0%} of the network's and "
        f"{result.fabric.intra_efficiency:.0%} of NVLink's nominal bandwidth, "
        f"{result.fabric.tree_latency_s * 1e6:.0f} us per tree level;",
        "  overlapped with compute (FSDP: forward and backward; DDP: the last backward; ZeRO-1: none, DeepSpeed reduces"
        " and gathers after the backward), one unit always exposed",
        "",
        f"  {'nodes':>5}" + "".join(f"{name:>20}" for name in result.curves) + f"  {'chosen':<14}{'tokens/s':>12}",
        f"  {'':>5}" + "".join(f"{'step s':>8}{'eff':>6}{'exp s':>6}" for _ in result.curves),
    ]
    for index, n in enumerate(nodes):
        cells = []
        for name, points in result.curves.items():
            point = points[index]
            if not result.fits[name][n]:
                cells.append(f"{'does not fit':>20}")
                continue
            cells.append(f"{point.step_s:>8.2f}{point.efficiency:>6.0%}{point.exposed_s:>6.2f}")
        choice = result.chosen[n]
        rate = f"{result.tokens_per_s(result.curves[choice][index]):>12,.0f}" if choice else f"{'-':>12}"
        lines.append(f"  {n:>5}" + "".join(cells) + f"  {choice or 'none fits':<14}{rate}")
    return "\n".join(lines)


def scaling_json(result: ScalingPlan) -> dict:
    return {
        "model": result.plan.job.model.name,
        "instance_type": result.plan.job.placement.instance_type,
        "mfu": result.plan.options.mfu,
        "mfu_source": result.plan.options.mfu_source,
        "fabric": asdict(result.fabric),
        "workload": asdict(result.workload),
        "curves": {name: [asdict(p) for p in points] for name, points in result.curves.items()},
        "fits": {name: {str(n): ok for n, ok in fits.items()} for name, fits in result.fits.items()},
        "chosen": {str(n): name for n, name in result.chosen.items()},
    }


def scaling_png(result: ScalingPlan, path: Path, measured: dict[int, float] | None = None) -> Path:
    """Efficiency and tokens/s against nodes for each strategy that fits; `measured` (nodes -> tokens/s of real
    runs) is drawn over the prediction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, points in result.curves.items():
        kept = [p for p in points if result.fits[name][p.nodes]]
        if not kept:
            continue
        nodes = [p.nodes for p in kept]
        left.plot(nodes, [100 * p.efficiency for p in kept], marker="o", label=name)
        right.plot(nodes, [result.tokens_per_s(p) for p in kept], marker="o", label=name)
    if measured:
        right.scatter(list(measured), list(measured.values()), color="black", zorder=5, label="measured")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("nodes")
        axis.grid(True, alpha=0.3)
        axis.legend()
    left.set_ylabel("scaling efficiency (%)")
    left.set_ylim(0, 105)
    right.set_ylabel("tokens/s")
    right.set_yscale("log")
    job = result.plan.job
    figure.suptitle(f"{job.model.name} on {job.placement.instance_type}: predicted (trainkit/plan/scaling_model.py)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def published_llm_curves(model: str, node_counts) -> list[scaling.Point]:
    """FULL_SHARD predictions for trainkit's recipe of `model` on p5 (the near-linear FSDP claim)."""
    from trainkit.job import build

    result = make_scaling(build({"model": model, "instance_type": "p5.48xlarge"}), PlanOptions(), tuple(node_counts))
    return [point for point in result.curves["FULL_SHARD"] if result.fits["FULL_SHARD"][point.nodes]]


def published_job_on(workload: dict, instance_type: str, node_counts) -> tuple[list[tuple[int, float, float]], str]:
    """A published table's job (its registry model, strategy and per-accelerator batch: published.resolved) as
    trainkit plans it on `instance_type` at each node count: (nodes, sequences/s, efficiency), and its MFU with
    where it comes from."""
    from trainkit.job import build

    gpus, strategy = INSTANCE_TYPES[instance_type].gpus, workload["strategy"]
    per_gpu = workload["per_device_batch"] * workload.get("micro_batches", 1)
    flags = {
        "model": workload["model"],
        "instance_type": instance_type,
        "sharding": strategy,
        "seq_len": workload["tokens_per_item"],
        "micro_batch_size": workload["per_device_batch"],
        "global_batch_size": per_gpu * gpus,  # one node's: make_scaling keeps each GPU's share at every size
    }
    result = make_scaling(build(flags), PlanOptions(), tuple(node_counts))
    seq = result.plan.job.data.seq_len
    points = [(p.nodes, result.tokens_per_s(p) / seq, p.efficiency) for p in result.curves[strategy]]
    options = result.plan.options
    return points, f"compute at MFU {options.mfu:.0%} ({options.mfu_source})"


def predicted_throughput(job: Job, world_sizes) -> dict[int, float] | None:
    """What the scaling model predicts (tokens/s) for this job's model, instance type, strategy and per-GPU batch
    at each world size of whole nodes; None where it describes no such job (a local run, a vision model)."""
    instance_type = job.placement.instance_type
    if instance_type not in scaling.FAMILY_OF_INSTANCE or not family_of(get_model(job.model.name).family).text:
        return None
    gpus = job.parallelism.nproc or INSTANCE_TYPES[instance_type].gpus
    sizes = sorted({size for size in world_sizes if size % gpus == 0})
    if not sizes:
        return None
    one_node = copy.deepcopy(job)
    one_node.parallelism.nodes, one_node.parallelism.min_nodes, one_node.parallelism.nproc = 1, None, gpus
    o = one_node.optimisation
    per_gpu = o.global_batch_size // job.world_size if o.global_batch_size else None
    if per_gpu:  # an elastic job's micro batch is sized for its smallest world: at most this world's share
        o.global_batch_size, o.micro_batch_size = per_gpu * gpus, min(o.micro_batch_size or per_gpu, per_gpu)
    result = make_scaling(one_node, PlanOptions(), tuple(size // gpus for size in sizes))
    strategy = result.plan.job.parallelism.sharding  # the given one, else the recipe's (make_plan fills it)
    return {point.nodes * gpus: result.tokens_per_s(point) for point in result.curves[strategy]}
