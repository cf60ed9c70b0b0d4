"""Memory, throughput and cost estimates for a job, before anything runs or is paid for.

The strategies a model's family trains with are the ones planned: FSDP2's four for Llama, DeepSpeed ZeRO-1 and DDP
for BERT (training/families.py `shardings`; those two are sized in trainkit/plan/data_parallel.py, DDP for
every family). Memory per GPU (bytes), N parameters (BERT: the registry's exact `BertForMaskedLM` count), mixed
precision as the trainer runs it (FSDP2 keeps fp32 master parameters, fp32 gradients and fp32 AdamW moments, and
all-gathers bf16 copies to compute):

    parameters       4N / S        S = shard group: all GPUs (FULL_SHARD, SHARD_GRAD_OP),
    gradients        4N / S            GPUs per node (HYBRID_SHARD)
    optimizer        8N / S        AdamW exp_avg + exp_avg_sq
    gathered params  bf16 working copies: 2 x (largest FSDP unit) x 2 for prefetch when resharding
                     after forward (FULL_SHARD, HYBRID_SHARD); all 2N kept from forward to backward
                     (SHARD_GRAD_OP)
    NO_SHARD, ZERO_1 parameters, gradients, optimizer state and communication buckets as data_parallel.py
                     says (DDP: 4N + 4N + 8N + 4N of buckets; ZeRO-1: 2N + 6N + 12N/world + the all-reduce's
                     fp32 bucket)
    activations      per layer 34*s*b*h bytes without recomputation (Korthikanti et al. 2022,
                     "Reducing Activation Recomputation in Large Transformer Models", eq. 1, with the
                     5*a*s/h attention-score term removed because SDPA/flash attention does not store
                     scores); with activation checkpointing, 2*s*b*h per recomputed layer (the saved
                     layer input; every layer, or every K-th with --ac-every K) plus one layer's 34*s*b*h
                     while it is recomputed
    logits           8*s*b*V: fp32 logits and their gradient

BERT's encoder layer is the shape Korthikanti et al. derive 34*s*b*h for (GELU MLP of 4h, dropout after attention
and MLP; Hugging Face's BERT attends through SDPA, so no scores are stored); its embeddings and the MLM head's
transform (a few s*b*h) are left out. A GPU "fits" when the total is at most 90% of its memory (the rest: CUDA
context, NCCL buffers, allocator fragmentation). Step time = model FLOPs per step / (MFU x peak x GPUs), with the
FLOPs formula of `training.common.flops` and a stated MFU assumption; the scaling model (scaling_model.py) adds the
communication it cannot hide at the job's node count for the strategy the job uses.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from training.common.flops import PEAK_BF16_TFLOPS
from training.families import family_of
from training.spec import ZERO_1, Job
from trainkit.errors import SpecError
from trainkit.hardware import INSTANCE_TYPES
from trainkit.infra.outputs import DEFAULT_INSTANCE_TYPE
from trainkit.job.lora import check_shape
from trainkit.job.models import get_model
from trainkit.job.validate import check_family, check_language_model
from trainkit.plan import data_parallel
from trainkit.plan import scaling_model as scaling
from trainkit.plan.cost import Cost, price_job

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
    priced: bool = True
    """False: no cost (`--scaling` prints none, so it asks no price)."""


@dataclass
class MemoryBreakdown:
    parameters: float
    gradients: float
    optimizer: float
    gathered_parameters: float
    activations: float
    logits: float
    buckets: float = 0.0
    """Communication buffers: DDP's copy of the gradients, DeepSpeed's reduce bucket."""

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
    cost: Cost | None = None
    """Where the price comes from, the stack's standing costs, a Capacity Block (trainkit/plan/cost.py)."""
    communication: scaling.Point | None = None
    """The scaling model at the job's node count for its strategy: the step with the communication it exposes."""
    fewest_nodes: int | None = None
    """The fewest nodes on which the job's strategy fits (None: not within 64)."""
    adapter_params: int | None = None
    """LoRA: the adapters' parameters (the ones trained)."""
    full_finetune: tuple[float, int | None] | None = None
    """LoRA: the same job as a full fine-tune, (memory per GPU, fewest nodes), at the plan's node count."""


def shard_group_size(sharding: str, world: int, gpus_per_node: int) -> int:
    """The GPUs one copy of the sharded state is spread over (ZeRO-1: the optimizer state's)."""
    groups = {"FULL_SHARD": world, "SHARD_GRAD_OP": world, "HYBRID_SHARD": gpus_per_node, "NO_SHARD": 1, ZERO_1: world}
    return groups[sharding]


def checkpointed_layers(job: Job, layers: int) -> int:
    """Layers whose activations are recomputed: every `ac_every`-th one (0, K, 2K, ...) with checkpointing on."""
    if not job.parallelism.activation_checkpointing:
        return 0
    return math.ceil(layers / (job.parallelism.ac_every or 1))


def memory_per_gpu(job: Job, sharding: str, world: int) -> MemoryBreakdown:
    entry = get_model(job.model.name)
    arch = entry.arch.truncated(job.model.layers)
    shape = arch.shape()
    n = arch.parameters()  # the registry's exact count (BERT: tied output matrix, biases, LayerNorms)
    s, b, h, v = job.data.seq_len, job.optimisation.micro_batch_size, arch.hidden_size, arch.vocab_size
    layers = shape.layers
    per_layer_full = 34 * s * b * h
    recomputed = checkpointed_layers(job, layers)
    activations = recomputed * 2 * s * b * h + (layers - recomputed) * per_layer_full
    if recomputed:
        activations += per_layer_full  # the layer being recomputed
    adapters = shape.adapter_params(job.lora.rank, job.lora.target_names) if job.lora.enabled else 0
    if sharding in data_parallel.DATA_PARALLEL:
        state = data_parallel.state_bytes(sharding, n, world)
        if adapters:  # DDP over the adapters only: the frozen base in bf16, nothing of it in a bucket
            state = {"parameters": 2 * n + 4 * adapters, "gradients": 4 * adapters, "optimizer": 8 * adapters}
            state["buckets"] = 4 * adapters
        return MemoryBreakdown(**state, gathered_parameters=0, activations=activations, logits=8 * s * b * v)
    group = shard_group_size(sharding, world, job.parallelism.nproc)
    largest_unit = max(shape.params_per_layer(), v * h)
    gathered = {"FULL_SHARD": 2 * largest_unit * 2, "HYBRID_SHARD": 2 * largest_unit * 2, "SHARD_GRAD_OP": 2 * n}
    if adapters:  # LoRA: the frozen base sharded in bf16, fp32 adapters with their gradients and moments
        trained, parameters = adapters, 2 * n + 4 * adapters
    else:
        trained, parameters = n, 4 * n
    return MemoryBreakdown(
        parameters=parameters / group,
        gradients=4 * trained / group,
        optimizer=8 * trained / group,
        gathered_parameters=gathered[sharding],
        activations=activations,
        logits=8 * s * b * v,
    )


def fewest_nodes(job: Job, sharding: str, gpu_bytes: float, most: int = 64) -> int | None:
    """The fewest nodes (of the job's GPUs per node) on which `sharding` fits a GPU, up to `most`; None: not even
    then. The memory is the plan's at each count, the micro batch the job's."""
    for nodes in range(1, most + 1):
        if memory_per_gpu(job, sharding, nodes * job.parallelism.nproc).total <= USABLE_FRACTION * gpu_bytes:
            return nodes
    return None


def step_cost(plan: Plan) -> scaling.StepCost:
    """What one GPU computes and communicates per optimizer step of the plan, for the scaling model."""
    job = plan.job
    shape = get_model(job.model.name).arch.truncated(job.model.layers).shape()
    fp32 = job.parallelism.precision == "fp32"  # auto: bf16 on these GPUs
    return scaling.StepCost(
        params=plan.param_count,
        compute_s=plan.step_time_s,
        micro_batches=plan.grad_accum_steps,
        largest_unit=max(shape.params_per_layer(), shape.vocab * shape.hidden),
        param_bytes=4 if fp32 else 2,
        # fp32 unless --reduce-dtype bf16 (a decoder's FSDP2; BERT's ZeRO-1 always reduces in fp32)
        grad_bytes=2 if job.parallelism.reduce_dtype == "bf16" and not fp32 else 4,
        ddp_grad_bytes=4,  # DDP keeps fp32 parameters and all-reduces their fp32 gradients
    )


def make_plan(job: Job, options: PlanOptions | None = None) -> Plan:
    """The estimate for a job built from the same flags as `invoke train` (trainkit.job.build); the
    recipe fills what is not given, and the global batch is raised to fill every GPU."""
    options = options or PlanOptions()
    entry = get_model(job.model.name)
    model, p, o = job.model, job.parallelism, job.optimisation
    if not family_of(entry.family).text:
        raise SpecError(
            f"invoke plan estimates language-model jobs (decoders, BERT); {model.name} is a vision model: measure it "
            f"with `invoke train --model {model.name} --synthetic --steps 20` instead"
        )
    recipe = entry.recipe
    p.sharding = p.sharding or recipe.sharding
    check_family(job, entry)  # a strategy or flag of another family (ZERO_1 for Llama), as `invoke train` says it
    instance_type = job.placement.instance_type or DEFAULT_INSTANCE_TYPE
    if instance_type not in INSTANCE_TYPES:
        raise SpecError(f"--instance-type {instance_type!r} is unknown; choose one of: {', '.join(INSTANCE_TYPES)}")
    if options.mfu is None:
        gpu = INSTANCE_TYPES[instance_type].gpu
        measured = bench_mfu(entry.label, gpu, options.bench_dir)
        options = (
            replace(options, mfu=measured[0], mfu_source=measured[1])
            if measured
            else replace(
                options, mfu=DEFAULT_MFU, mfu_source=f"assumed; no {options.bench_dir}/{entry.label}-{gpu.lower()}.json"
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
    job.placement.instance_type = instance_type
    p.nproc = p.nproc or instance.gpus
    job.data.seq_len = job.data.seq_len or recipe.seq_len
    check_language_model(job, entry)  # as `invoke train` refuses them: past the context, more layers than it has
    o.micro_batch_size = o.micro_batch_size or recipe.micro_batch_size
    if p.activation_checkpointing is None:
        p.activation_checkpointing = recipe.activation_checkpointing
    if p.ac_every is None and p.activation_checkpointing:
        p.ac_every = recipe.ac_every  # the recipe's GPU default (training/recipes.py)
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
    check_shape(job, entry)  # as `invoke train` refuses a rank or targets the model cannot take
    strategies = family_of(entry.family).shardings
    memory = {name: memory_per_gpu(job, name, world) for name in strategies}
    gpu_bytes = instance.gpu_memory_gib * GIB
    fits = {name: breakdown.total <= USABLE_FRACTION * gpu_bytes for name, breakdown in memory.items()}
    arch = entry.arch.truncated(model.layers)
    lora = job.lora
    adapters = arch.shape().adapter_params(lora.rank, lora.target_names) if lora.enabled else None
    flops_per_token = arch.shape().flops_per_token(job.data.seq_len, adapter_params=adapters)
    tokens_per_step = global_batch * job.data.seq_len
    peak = PEAK_BF16_TFLOPS[instance.gpu] * 1e12
    step_time = flops_per_token * tokens_per_step / (options.mfu * peak * world)
    tokens_per_s = tokens_per_step / step_time
    if options.priced:
        cost = price_job(job, options.price_per_hour, options.epoch_tokens, tokens_per_s)
    else:
        cost = Cost(None, None, None, job.placement.target)
    plan = Plan(
        job=job,
        options=options,
        param_count=arch.parameters(),
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
        usd_per_hour=cost.usd_per_hour,
        usd_per_epoch=cost.usd_per_epoch,
        price_source=cost.source,
        cost=cost,
    )
    plan.fewest_nodes = fewest_nodes(job, p.sharding, gpu_bytes)
    plan.adapter_params = adapters
    if lora.enabled:  # the same job as a full fine-tune, for the comparison the plan prints
        full = replace(job, lora=replace(lora, rank=None, alpha=None, dropout=None, targets=None))
        plan.full_finetune = (memory_per_gpu(full, p.sharding, world).total, fewest_nodes(full, p.sharding, gpu_bytes))
    fabric = replace(scaling.fabric_for(instance_type), per_node=p.nproc)
    plan.communication = scaling.predict(step_cost(plan), p.sharding, p.nodes, fabric)
    return plan


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
