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

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.common.distributed import resolve_precision
from training.common.files import publish_text
from training.common.job import MODEL_CONFIG, data_source, read_job
from training.common.run import peak_memory_bytes, synchronize
from training.llm.data import IGNORE_INDEX, PackedDataset, load_records, tokenize_examples
from training.llm.model import build_model
from training.llm.tokenizer import load_tokenizer

SHARDED = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}  # strategy -> reshard_after_forward


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path, help="spec.json of a run folder trainkit prepared")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    job, run_dir = read_job(args.spec), args.spec.parent
    if job.parallelism.sharding not in SHARDED:
        raise SystemExit(f"the reference shards with FSDP2 only ({', '.join(SHARDED)}), not {job.parallelism.sharding}")

    gpu = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if gpu:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    dist.init_process_group("nccl" if gpu else "gloo", device_id=device if gpu else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    bf16 = resolve_precision(job.parallelism.precision) == "bf16"  # what trainkit's Accelerator gets

    records = load_records(data_source(job, run_dir), job.data.dataset_split)
    dataset = PackedDataset.pack(*tokenize_examples(records, load_tokenizer("byte")), job.data.seq_len)

    model = build_model(str(run_dir / MODEL_CONFIG), None, job.run.seed)
    if job.parallelism.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mesh = init_device_mesh(device.type, (world,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if bf16 else None
    shard = {"mesh": mesh, "reshard_after_forward": SHARDED[job.parallelism.sharding]}
    if policy is not None:
        shard["mp_policy"] = policy
    for block in model.model.layers:
        fully_shard(block, **shard)
    fully_shard(model, **shard)
    opt = job.optimisation
    optimizer = torch.optim.AdamW(
        model.parameters(),
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
            (dataset.input_ids[mine[i : i + micro]].to(device), dataset.labels[mine[i : i + micro]].to(device))
            for i in range(0, per_rank, micro)
        ]
        data_s = time.perf_counter() - started
        loss_sum = torch.zeros((), device=device)
        for index, (inputs, labels) in enumerate(batches):
            model.set_requires_gradient_sync(index == len(batches) - 1)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(input_ids=inputs).logits
            loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX
            )
            (loss / len(batches)).backward()
            loss_sum += loss.detach() / len(batches)
        synchronize()
        optimizer_started = time.perf_counter()
        if opt.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), opt.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize()
        optimizer_s = time.perf_counter() - optimizer_started
        dist.all_reduce(loss_sum)
        loss_value = loss_sum.item() / world
        step_s = time.perf_counter() - started
        steps.append(
            {
                "step": step + 1,
                "loss": loss_value,
                "step_time_s": step_s,
                "data_wait_s": data_s,
                "optimizer_s": optimizer_s,
                "tokens_per_s": opt.global_batch_size * job.data.seq_len / step_s,
                "time": time.time(),
            }
        )
    if rank == 0:
        record = {
            "what": "bare FSDP2 reference loop (training/bench/reference.py)",
            "world_size": world,
            "precision": "bf16" if bf16 else "fp32",
            "reshard_after_forward": SHARDED[job.parallelism.sharding],
            "peak_memory_bytes": peak_memory_bytes(),
            "steps": steps,
        }
        publish_text(args.out, json.dumps(record, indent=2) + "\n")
    dist.barrier()  # no rank tears its process group down while rank 0 still writes (gloo aborted there once)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
