"""What `invoke plan` prints of a plan (memory.py makes it): the memory table, the fewest nodes, LoRA against a full
fine-tune, throughput and cost; or the plan as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict

from training.spec import ZERO_1
from trainkit.plan.cost import cost_lines
from trainkit.plan.memory import GIB, USABLE_FRACTION, Plan

COLUMNS = (
    ("params", "parameters", 9),
    ("grads", "gradients", 9),
    ("optim", "optimizer", 9),
    ("gathered", "gathered_parameters", 10),
    ("buckets", "buckets", 9),
    ("activ", "activations", 9),
    ("logits", "logits", 9),
)
NOTES = {  # what the data-parallel rows hold (trainkit/plan/data_parallel.py)
    ZERO_1: "ZERO_1: DeepSpeed ZeRO stage 1: bf16 parameters and gradients and their fp32 sum on every GPU, fp32\n"
    "          master weights and two moments (12 bytes a parameter) over the {world} ranks; buckets: the fp32\n"
    "          all-reduce's copy",
    "NO_SHARD": "NO_SHARD: DDP: fp32 parameters, gradients and two moments on every GPU; buckets: DDP's copy of the\n"
    "          gradients",
}


LORA_NOTES = {
    "NO_SHARD": "NO_SHARD: DDP over the adapters: the bf16 frozen base and the fp32 adapters with their gradients\n"
    "          and moments on every GPU; buckets: DDP's copy of the adapters' gradients",
}


def render_plan(plan: Plan) -> str:
    job, options = plan.job, plan.options
    layers, sharding = job.model.layers, job.parallelism.sharding
    label = f" (truncated to {layers} layers)" if layers else ""
    every = job.parallelism.ac_every or 1
    checkpointing = "off" if not job.parallelism.activation_checkpointing else "on" if every == 1 else f"every {every}"
    breakdowns = plan.memory_per_gpu.values()  # a part no strategy of this family holds gets no column
    columns = [c for c in COLUMNS if any(getattr(m, c[1]) for m in breakdowns)] + [("total", "total", 9)]
    header = "".join(f"{title:>{width}}" for title, _, width in columns)
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
        row = "".join(f"{getattr(m, field) / GIB:>{width}.1f}" for _, field, width in columns)
        lines.append(f" {marker}{name:<14}{row}  {'yes' if plan.fits[name] else 'NO'}")
    notes = NOTES | (LORA_NOTES if job.lora.enabled else {})
    lines += [f"  {notes[name].format(world=plan.world_size)}" for name in plan.memory_per_gpu if name in notes]
    lines += _fitting(plan)
    seq, point = job.data.seq_len, plan.communication  # the scaling model at the job's nodes
    with_communication = plan.tokens_per_s * plan.step_time_s / point.step_s
    lines += [
        "",
        f"  throughput ({sharding}, MFU {options.mfu:.1%} of {plan.flops_per_token / 1e9:.1f} GFLOP/token; "
        f"{options.mfu_source})",
        f"    step time         {plan.step_time_s:.2f} s compute; {point.step_s:.2f} s with "
        f"{point.exposed_s:.3f} s of its {point.communication_s:.3f} s of collectives exposed (scaling model)",
        f"    tokens/s          {plan.tokens_per_s:,.0f} ({plan.tokens_per_s / plan.world_size:,.0f} per GPU, "
        f"{plan.tokens_per_s / seq:,.0f} sequences/s); {with_communication:,.0f} with the communication",
    ]
    lines += cost_lines(plan.cost, job.parallelism.nodes, str(job.placement.instance_type), options.epoch_tokens)
    return "\n".join(lines)


def _fitting(plan: Plan) -> list[str]:
    """The fewest nodes the job's strategy fits on; under LoRA, against the same job as a full fine-tune."""
    job = plan.job
    kind, sharding = job.placement.instance_type, job.parallelism.sharding

    def nodes(count: int | None) -> str:
        return f"{count} x {kind}" if count else f"more than 64 x {kind}"

    lines = [f"  fewest nodes        {nodes(plan.fewest_nodes)} ({sharding}, this micro batch)"]
    if plan.full_finetune is not None:
        lora, (full_bytes, full_nodes) = job.lora, plan.full_finetune
        ours = plan.memory_per_gpu[sharding].total
        lines += [
            f"  LoRA                rank {lora.rank} on {', '.join(lora.target_names or ['every linear layer'])}: "
            f"{plan.adapter_params:,} parameters trained ({plan.adapter_params / plan.param_count:.2%})",
            f"    against a full fine-tune: {ours / GIB:.1f} GiB per GPU instead of {full_bytes / GIB:.1f} here; "
            f"fewest nodes {nodes(plan.fewest_nodes)} instead of {nodes(full_nodes)}",
        ]
    return lines


def plan_json(plan: Plan) -> str:
    data = asdict(plan)
    for name, breakdown in plan.memory_per_gpu.items():
        data["memory_per_gpu"][name]["total"] = breakdown.total
    return json.dumps(data, indent=2, default=str)  # PlanOptions.bench_dir: a path
