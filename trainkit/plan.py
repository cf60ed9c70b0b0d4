"""Memory, throughput and cost estimates for a job, before anything runs or is paid for.

Memory per GPU (bytes), N parameters, mixed precision as the trainer runs it (FSDP2 keeps fp32
master parameters, fp32 gradients and fp32 AdamW moments, and all-gathers bf16 copies to compute):

    parameters       4N / S        S = shard group: all GPUs (FULL_SHARD, SHARD_GRAD_OP),
    gradients        4N / S            GPUs per node (HYBRID_SHARD), 1 (NO_SHARD)
    optimizer        8N / S        AdamW exp_avg + exp_avg_sq
    gathered params  bf16 working copies: 2 x (largest FSDP unit) x 2 for prefetch when resharding
                     after forward (FULL_SHARD, HYBRID_SHARD); all 2N kept from forward to backward
                     (SHARD_GRAD_OP); none beyond the fp32 replica (NO_SHARD)
    activations      per layer 34*s*b*h bytes without recomputation (Korthikanti et al. 2022,
                     "Reducing Activation Recomputation in Large Transformer Models", eq. 1, with the
                     5*a*s/h attention-score term removed because SDPA/flash attention does not store
                     scores); with activation checkpointing, 2*s*b*h per layer (the saved layer input)
                     plus one layer's 34*s*b*h while it is recomputed
    logits           8*s*b*V: fp32 logits and their gradient

A GPU "fits" when the total is at most 90% of its memory (the rest: CUDA context, NCCL buffers,
allocator fragmentation). Step time = model FLOPs per step / (MFU x peak x GPUs), with the FLOPs
formula of `training.common.flops` and a stated MFU assumption.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from training.common.flops import PEAK_BF16_TFLOPS
from training.common.job import SHARDING_STRATEGIES, Job

from . import scaling
from .cluster import DEFAULT_INSTANCE_TYPE
from .errors import SpecError
from .hardware import INSTANCE_TYPES, ON_DEMAND_USD_PER_HOUR, PRICE_TABLE_AS_OF
from .job.models import get_model
from .job.validate import check_language_model

GIB = 1024**3
USABLE_FRACTION = 0.9


DEFAULT_MFU = 0.40
BENCH_DIR = Path("benchmarks")


@dataclass
class PlanOptions:
    """What only the estimate needs, besides the job. mfu None: a bench file's measured MFU for the model on
    the instance's GPU (`invoke bench train` writes <bench_dir>/<model>-<gpu>.json) when there is one, else 40%."""

    mfu: float | None = None
    price_per_hour: float | None = None
    epoch_tokens: int = 100_000_000
    bench_dir: Path = BENCH_DIR
    mfu_source: str = "assumed (--mfu)"


@dataclass
class MemoryBreakdown:
    parameters: float
    gradients: float
    optimizer: float
    gathered_parameters: float
    activations: float
    logits: float

    @property
    def total(self) -> float:
        return sum(asdict(self).values())


@dataclass
class Plan:
    job: Job
    """The job as planned: the recipe's values filled in, nproc = GPUs per instance."""
    options: PlanOptions
    param_count: int
    world_size: int
    shard_group: int
    global_batch_size: int
    grad_accum_steps: int
    memory_per_gpu: dict[str, MemoryBreakdown]
    gpu_memory_bytes: float
    fits: dict[str, bool]
    flops_per_token: float
    step_time_s: float
    tokens_per_s: float
    usd_per_hour: float | None
    usd_per_epoch: float | None
    price_source: str


def shard_group_size(sharding: str, world: int, gpus_per_node: int) -> int:
    return {"FULL_SHARD": world, "SHARD_GRAD_OP": world, "HYBRID_SHARD": gpus_per_node, "NO_SHARD": 1}[sharding]


def memory_per_gpu(job: Job, sharding: str, world: int) -> MemoryBreakdown:
    entry = get_model(job.model.name)
    arch = entry.arch.truncated(job.model.layers)
    shape = arch.shape()
    n = shape.param_count()
    s, b, h, v = job.data.seq_len, job.optimisation.micro_batch_size, arch.hidden_size, arch.vocab_size
    layers = shape.layers
    group = shard_group_size(sharding, world, job.parallelism.nproc)
    largest_unit = max(shape.params_per_layer(), v * h)
    gathered = {
        "FULL_SHARD": 2 * largest_unit * 2,
        "HYBRID_SHARD": 2 * largest_unit * 2,
        "SHARD_GRAD_OP": 2 * n,
        "NO_SHARD": 0,
    }[sharding]
    per_layer_full = 34 * s * b * h
    if job.parallelism.activation_checkpointing:
        activations = layers * 2 * s * b * h + per_layer_full
    else:
        activations = layers * per_layer_full
    return MemoryBreakdown(
        parameters=4 * n / group,
        gradients=4 * n / group,
        optimizer=8 * n / group,
        gathered_parameters=gathered,
        activations=activations,
        logits=8 * s * b * v,
    )


def make_plan(job: Job, options: PlanOptions | None = None) -> Plan:
    """The estimate for a job built from the same flags as `invoke train` (trainkit.job.build); the
    recipe fills what is not given, and the global batch is raised to fill every GPU."""
    options = options or PlanOptions()
    entry = get_model(job.model.name)
    model, p, o = job.model, job.parallelism, job.optimisation
    if entry.family != "llama":
        raise SpecError(
            f"invoke plan estimates sharded language-model jobs; {model.name} trains data-parallel, so every GPU "
            "holds the whole model: measure it with `invoke train --model "
            f"{model.name} --synthetic --steps 20` instead"
        )
    instance_type = job.placement.instance_type or DEFAULT_INSTANCE_TYPE
    if instance_type not in INSTANCE_TYPES:
        raise SpecError(f"--instance-type {instance_type!r} is unknown; choose one of: {', '.join(INSTANCE_TYPES)}")
    if options.mfu is None:
        gpu = INSTANCE_TYPES[instance_type].gpu
        measured = bench_mfu(model.name, gpu, options.bench_dir)
        options = (
            replace(options, mfu=measured[0], mfu_source=measured[1])
            if measured
            else replace(
                options, mfu=DEFAULT_MFU, mfu_source=f"assumed; no {options.bench_dir}/{model.name}-{gpu.lower()}.json"
            )
        )
    if not 0 < options.mfu <= 1:
        raise SpecError(f"--mfu must be in (0, 1] (got {options.mfu}); 0.3-0.5 is typical for FSDP on H100")
    price = options.price_per_hour
    if price is not None and not (math.isfinite(price) and price > 0):
        raise SpecError(f"--price-per-hour must be a positive number of dollars (got {options.price_per_hour})")
    if not options.epoch_tokens > 0:
        raise SpecError(f"--epoch-tokens must be a positive number of tokens (got {options.epoch_tokens})")
    if p.min_nodes is not None and p.min_nodes != p.nodes:
        raise SpecError(
            f"--nodes {p.min_nodes}:{p.nodes}: invoke plan estimates one size; give --nodes {p.nodes} (and once more "
            f"with --nodes {p.min_nodes} for the smallest)"
        )
    instance = INSTANCE_TYPES[instance_type]
    if p.nproc is not None and not 0 < p.nproc <= instance.gpus:
        raise SpecError(
            f"--gpus-per-node {p.nproc}: a {instance_type} node has {instance.gpus} GPUs; use 1..{instance.gpus}"
        )
    recipe = entry.recipe
    job.placement.instance_type = instance_type
    p.sharding = p.sharding or "FULL_SHARD"
    p.nproc = p.nproc or instance.gpus
    job.data.seq_len = job.data.seq_len or recipe.seq_len
    check_language_model(job, entry)  # as `invoke train` refuses them: past the context, more layers than it has
    o.micro_batch_size = o.micro_batch_size or recipe.micro_batch_size
    if p.activation_checkpointing is None:
        p.activation_checkpointing = recipe.activation_checkpointing
    world = p.nodes * p.nproc
    per_step = o.micro_batch_size * world
    global_batch = o.global_batch_size or max(recipe.global_batch_size, per_step)
    if global_batch % per_step:
        if o.global_batch_size:
            raise SpecError(
                f"--global-batch-size {global_batch} is not divisible by micro batch {o.micro_batch_size} x "
                f"{world} GPUs = {per_step}; use a multiple of {per_step}"
            )
        global_batch = -(-global_batch // per_step) * per_step
    o.global_batch_size = global_batch
    memory = {name: memory_per_gpu(job, name, world) for name in SHARDING_STRATEGIES}
    gpu_bytes = instance.gpu_memory_gib * GIB
    fits = {name: breakdown.total <= USABLE_FRACTION * gpu_bytes for name, breakdown in memory.items()}
    shape = entry.arch.truncated(model.layers).shape()
    flops_per_token = shape.flops_per_token(job.data.seq_len)
    tokens_per_step = global_batch * job.data.seq_len
    peak = PEAK_BF16_TFLOPS[instance.gpu] * 1e12
    step_time = flops_per_token * tokens_per_step / (options.mfu * peak * world)
    tokens_per_s = tokens_per_step / step_time
    price = options.price_per_hour or ON_DEMAND_USD_PER_HOUR.get(instance_type)
    usd_per_hour = price * p.nodes if price else None
    usd_per_epoch = usd_per_hour * options.epoch_tokens / tokens_per_s / 3600 if usd_per_hour else None
    source = "--price-per-hour" if options.price_per_hour else f"on-demand us-east-1, {PRICE_TABLE_AS_OF}"
    return Plan(
        job=job,
        options=options,
        param_count=shape.param_count(),
        world_size=world,
        shard_group=shard_group_size(p.sharding, world, p.nproc),
        global_batch_size=global_batch,
        grad_accum_steps=global_batch // per_step,
        memory_per_gpu=memory,
        gpu_memory_bytes=gpu_bytes,
        fits=fits,
        flops_per_token=flops_per_token,
        step_time_s=step_time,
        tokens_per_s=tokens_per_s,
        usd_per_hour=usd_per_hour,
        usd_per_epoch=usd_per_epoch,
        price_source=source if price else "no price known; pass --price-per-hour",
    )


def bench_mfu(model: str, gpu: str, folder: Path) -> tuple[float, str] | None:
    """(median MFU against the datasheet peak, where it comes from) of trainkit's runs in the bench file of
    `model` on `gpu`, or None when there is no such file or it has no MFU."""
    path = Path(folder) / f"{model}-{gpu.lower()}.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        values = [float(run["mfu_datasheet"]) for run in data["trainkit"] if run.get("mfu_datasheet") is not None]
        job = data.get("job", {})
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
        raise SpecError(
            f"{path} is not a results file of `invoke bench train` ({error!r}): move it away, rerun the bench, or "
            "give --mfu"
        ) from None
    if not values or not all(0 < value <= 1 for value in values):
        raise SpecError(f"{path}: its MFU values {values} are not in (0, 1]; rerun the bench or give --mfu")
    if job.get("precision") != "bf16":  # the plan is for bf16 training on these GPUs
        return None
    shape = f"{job.get('layers') or 'all'} layers, seq {job.get('seq_len')}, {data.get('measured', 'undated')}"
    return statistics.median(values), f"measured: {path}, median of {len(values)} runs ({shape})"


def render_plan(plan: Plan) -> str:
    job, options = plan.job, plan.options
    layers, sharding = job.model.layers, job.parallelism.sharding
    label = f" (truncated to {layers} layers)" if layers else ""
    checkpointing = "on" if job.parallelism.activation_checkpointing else "off"
    columns = [("params", 9), ("grads", 9), ("optim", 9), ("gathered", 10), ("activ", 9), ("logits", 9), ("total", 9)]
    header = "".join(f"{title:>{width}}" for title, width in columns)
    lines = [
        f"Plan: {job.model.name}{label} on {job.parallelism.nodes} x {job.placement.instance_type} "
        f"({plan.world_size} GPUs)",
        f"  parameters          {plan.param_count:,} ({plan.param_count / 1e9:.2f} B)",
        f"  batch               global {plan.global_batch_size} x seq {job.data.seq_len}, "
        f"micro {job.optimisation.micro_batch_size}, "
        f"grad accumulation {plan.grad_accum_steps}, activation checkpointing {checkpointing}",
        "",
        f"  memory per GPU (GiB; {USABLE_FRACTION:.0%} of {plan.gpu_memory_bytes / GIB:.0f} GiB usable)",
        f"  {'strategy':<14}{header}  fits",
    ]
    for name, m in plan.memory_per_gpu.items():
        marker = "*" if name == sharding else " "
        cells = [m.parameters, m.gradients, m.optimizer, m.gathered_parameters, m.activations, m.logits, m.total]
        row = "".join(f"{value / GIB:>{width}.1f}" for value, (_, width) in zip(cells, columns, strict=True))
        lines.append(f" {marker}{name:<14}{row}  {'yes' if plan.fits[name] else 'NO'}")
    lines += [
        "",
        f"  throughput ({sharding}, MFU {options.mfu:.1%} of {plan.flops_per_token / 1e9:.1f} GFLOP/token; "
        f"{options.mfu_source})",
        f"    step time         {plan.step_time_s:.2f} s",
        f"    tokens/s          {plan.tokens_per_s:,.0f} ({plan.tokens_per_s / plan.world_size:,.0f} per GPU)",
    ]
    if plan.usd_per_hour is not None:
        lines += [
            f"  cost ({plan.price_source})",
            f"    $ per hour        {plan.usd_per_hour:,.2f}",
            f"    $ per epoch       {plan.usd_per_epoch:,.2f} (epoch = {options.epoch_tokens:,} tokens; "
            "set --epoch-tokens)",
        ]
    else:
        lines.append(f"  cost                {plan.price_source}")
    return "\n".join(lines)


def plan_json(plan: Plan) -> str:
    data = asdict(plan)
    for name, breakdown in plan.memory_per_gpu.items():
        data["memory_per_gpu"][name]["total"] = breakdown.total
    return json.dumps(data, indent=2, default=str)  # PlanOptions.bench_dir: a path


# --------------------------------------------------------------------------- scaling (`invoke plan --scaling`)


@dataclass
class ScalingPlan:
    """The scaling model's predictions for one job (trainkit/scaling.py): every strategy at every node count,
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
    plan = make_plan(job, options)
    gpus = plan.job.parallelism.nproc
    fabric = replace(scaling.fabric_for(plan.job.placement.instance_type), per_node=gpus)
    shape = get_model(job.model.name).arch.truncated(job.model.layers).shape()
    tokens = plan.job.optimisation.micro_batch_size * plan.grad_accum_steps * plan.job.data.seq_len
    peak = PEAK_BF16_TFLOPS[fabric.accelerator] * 1e12
    fp32 = plan.job.parallelism.precision == "fp32"  # auto: bf16 on these GPUs
    workload = scaling.StepCost(
        params=plan.param_count,
        compute_s=tokens * plan.flops_per_token / (plan.options.mfu * peak),
        micro_batches=plan.grad_accum_steps,
        largest_unit=max(shape.params_per_layer(), shape.vocab * shape.hidden),
        param_bytes=4 if fp32 else 2,
        grad_bytes=4 if fp32 or plan.job.parallelism.reduce_dtype == "fp32" else 2,
        ddp_grad_bytes=4,  # DDP keeps fp32 parameters and all-reduces their fp32 gradients
    )
    fits = {
        name: {
            n: memory_per_gpu(plan.job, name, n * gpus).total <= USABLE_FRACTION * plan.gpu_memory_bytes
            for n in node_counts
        }
        for name in SHARDING_STRATEGIES
    }
    curves = {}
    for name in SHARDING_STRATEGIES:  # efficiency against the smallest size that fits (70B needs several nodes)
        smallest = next((n for n in node_counts if fits[name][n]), node_counts[0])
        curves[name] = scaling.curve(workload, name, fabric, node_counts, base_nodes=smallest)
    chosen = {}
    for index, n in enumerate(node_counts):
        fitting = [name for name in SHARDING_STRATEGIES if fits[name][n]]
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
        "  overlapped with compute (FSDP: forward and backward; DDP: the last backward), one unit always exposed",
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
    figure.suptitle(f"{job.model.name} on {job.placement.instance_type}: predicted (trainkit/scaling.py)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def published_llm_curves(model: str, node_counts) -> list[scaling.Point]:
    """FULL_SHARD predictions for trainkit's recipe of `model` on p5 (the near-linear FSDP claim)."""
    from .job import build

    result = make_scaling(build({"model": model, "instance_type": "p5.48xlarge"}), PlanOptions(), tuple(node_counts))
    return [point for point in result.curves["FULL_SHARD"] if result.fits["FULL_SHARD"][point.nodes]]


def predicted_throughput(job: Job, world_sizes) -> dict[int, float] | None:
    """What the scaling model predicts (tokens/s) for this job's model, instance type, strategy and per-GPU batch
    at each world size of whole nodes; None where it describes no such job (a local run, a vision model)."""
    instance_type = job.placement.instance_type
    if instance_type not in scaling.FAMILY_OF_INSTANCE or get_model(job.model.name).family != "llama":
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
    strategy = job.parallelism.sharding or "FULL_SHARD"
    return {point.nodes * gpus: result.tokens_per_s(point) for point in result.curves[strategy]}
