"""The bare reference of `invoke bench train`: the plain torch loop a user would write instead of trainkit.

Run under torchrun on a run folder trainkit prepared (its spec.json, model config and data):

    torchrun --standalone --nproc-per-node 2 -m training.bench.reference --spec runs/<id>/spec.json --out ref.json

The same model (built from the run's config, the same seed), the same packed blocks, global and micro batch
and precision; FSDP2 `fully_shard` on every decoder block and then the root, as PyTorch's FSDP2 tutorial does,
reshard after forward unless the job asks for SHARD_GRAD_OP, and on GPUs with bf16 the policy Accelerate gives
trainkit (bf16 parameters and reductions) with bf16 autocast; AdamW with the job's hyperparameters (fused on
GPUs), the job's gradient clipping. What it leaves out is what trainkit adds: checkpoints, metrics, the learning
rate schedule, elastic restarts, and the loss normalisation over the whole global batch's tokens (its loss is
each micro batch's mean, so its loss values are close to trainkit's but not equal). Each step is timed like
trainkit's (input, forward and backward, optimizer, the device synchronised at each edge), and stamped with the
wall clock after it; rank 0 writes every step's times and loss to --out.
"""

from __future__ import annotations

import time
from typing import NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.bench import timing
from training.llm.model import build_model
from training.spec import MODEL_CONFIG, weights_path
from training.text import dataset as text
from training.text.formats import IGNORE_INDEX
from training.text.tokenizer import job_tokenizer_source, load_tokenizer

SHARDED = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}  # strategy -> reshard_after_forward


def main(argv: list[str] | None = None) -> NoReturn:
    ctx = timing.setup(argv, __doc__.splitlines()[0])
    job, run_dir, gpu, device, bf16 = ctx.job, ctx.run_dir, ctx.gpu, ctx.device, ctx.bf16
    if job.parallelism.sharding not in SHARDED:
        raise SystemExit(f"the reference shards with FSDP2 only ({', '.join(SHARDED)}), not {job.parallelism.sharding}")
    rank, world = dist.get_rank(), dist.get_world_size()

    dataset = text.load(job, run_dir, load_tokenizer(job_tokenizer_source(job)), text.DECODER, rank)
    # What the trainer passes the model (--packing masked: per-example positions, attention kept to each example).
    names = ("input_ids", "labels", "position_ids" if (job.data.packing or "masked") == "masked" else None)

    pretrained = job.model.init == "pretrained"
    model = build_model(None if pretrained else str(run_dir / MODEL_CONFIG), weights_path(job), job.run.seed)
    if job.lora.enabled:  # PEFT as its docs have a user do it: the adapted model, its trainable parameters only
        from peft import LoraConfig, get_peft_model

        lora = job.lora
        config = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.scale_alpha,
            lora_dropout=lora.dropout or 0.0,
            target_modules=list(lora.target_names) if lora.target_names else "all-linear",  # PEFT: all but the head
        )
        model = get_peft_model(model, config)
    if job.parallelism.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mesh = init_device_mesh(device.type, (world,))
    # bf16 compute, fp32 gradient reduction: trainkit's default (training/common/distributed.py mixed_precision_policy)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    shard = {"mesh": mesh, "reshard_after_forward": SHARDED[job.parallelism.sharding]}
    if policy is not None:
        shard["mp_policy"] = policy
    layers = model.base_model.model.model.layers if job.lora.enabled else model.model.layers
    for block in layers:
        fully_shard(block, **shard)
    fully_shard(model, **shard)
    opt = job.optimisation
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=opt.lr,
        betas=(0.9, 0.95),
        weight_decay=opt.weight_decay,
        fused=gpu or None,
        foreach=None if gpu else True,
    )

    per_rank, micro = opt.global_batch_size // world, opt.micro_batch_size
    if per_rank * world != opt.global_batch_size or per_rank % micro:
        raise SystemExit(f"global batch {opt.global_batch_size} does not split into {world} x micro batches of {micro}")
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(job.run.seed))
    steps = []
    for step in range(opt.steps):
        started = time.perf_counter()
        first = (step * opt.global_batch_size + rank * per_rank) % len(dataset)
        mine = order[torch.arange(first, first + per_rank) % len(dataset)]
        batches = [
            [dataset.rows(name, mine[i : i + micro]).to(device) if name else None for name in names]
            for i in range(0, per_rank, micro)
        ]
        data_s = time.perf_counter() - started
        loss_sum = torch.zeros((), device=device)
        for index, (inputs, labels, positions) in enumerate(batches):
            model.set_requires_gradient_sync(index == len(batches) - 1)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(input_ids=inputs, position_ids=positions).logits
            loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX
            )
            (loss / len(batches)).backward()
            loss_sum += loss.detach() / len(batches)
        optimizer_s = timing.optimizer_phase(model, optimizer, opt.grad_clip)
        dist.all_reduce(loss_sum)
        rate = {"tokens_per_s": opt.global_batch_size * job.data.seq_len}
        steps.append(timing.step_record(step + 1, loss_sum.item() / world, started, data_s, optimizer_s, rate))
    what = {
        "what": "bare FSDP2 reference loop (training/bench/reference.py)"
        + (", LoRA through PEFT's get_peft_model" if job.lora.enabled else ""),
        "precision": "bf16" if bf16 else "fp32",
        "reshard_after_forward": SHARDED[job.parallelism.sharding],
    }
    timing.finish(ctx.out, what, steps)


if __name__ == "__main__":
    main()
