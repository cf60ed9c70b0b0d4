"""Run under torchrun (2 processes, gloo, CPU): each fast path of training/llm/fast_paths.py against the plain
FSDP2 path on the same model, seed and batches, one path at a time. Rank 0 prints one JSON line: per path, the
losses of a few steps and what the prepared model holds (`fast_paths.taken`). tests/e2e/test_fast_paths.py judges.

The model is sharded as the trainer's Accelerate prepare does (fully_shard per decoder layer, then the root) with
the trainer's own pieces: `compile_layers` and `checkpoint_every` before sharding, `schedule` after, `attention`
around the forward, `mixed_precision_policy` for the reduction dtype, `optimizer_kernel` for AdamW's kernel.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

from training.common.distributed import mixed_precision_policy
from training.llm import fast_paths

CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4}
CONFIG |= {"num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 64}
PATHS = {
    "plain": {},
    "selective_ac": {"ac_every": 2},
    "prefetch": {"prefetch": 2},
    "last_layer_kept": {"reshard_last_layer": False},
    "flash": {"attention": "flash"},
    "math_checkpointed": {"attention": "math", "ac_every": 1},  # recomputed in backward with the same kernel
    "bf16": {"bf16": True},
    "bf16_reduce": {"bf16": True, "reduce_dtype": "bf16"},
    "fused_adamw": {"fused": True},
    "compiled": {"compile": True},
}
STEPS, BATCH, SEQ = 3, 4, 32


def train(options: dict, mesh, rank: int) -> tuple[list[float], dict]:
    graphs = fast_paths.compiled_graphs()
    torch.manual_seed(0)
    config = LlamaConfig(**CONFIG, attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    model.config.use_cache = False
    if options.get("compile"):
        fast_paths.compile_layers(model)
    if options.get("ac_every"):
        fast_paths.checkpoint_every(model, options["ac_every"])
    policy = None
    if options.get("bf16"):
        policy = MixedPrecisionPolicy(
            **(
                mixed_precision_policy("bf16", options.get("reduce_dtype"))
                or {"param_dtype": torch.bfloat16, "reduce_dtype": torch.bfloat16, "output_dtype": torch.bfloat16}
            )
        )
    shard = {"mesh": mesh} | ({"mp_policy": policy} if policy else {})
    for layer in model.model.layers:
        fully_shard(getattr(layer, "_checkpoint_wrapped_module", layer), **shard)
    fully_shard(model, **shard)
    fast_paths.schedule(model, options.get("prefetch", 0), options.get("reshard_last_layer", True))
    fused = options.get("fused", False)  # as the trainer builds it
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused or None, foreach=None if fused else True)
    generator = torch.Generator().manual_seed(1234 + rank)
    losses = []
    for _ in range(STEPS):
        tokens = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), generator=generator)
        with fast_paths.attention(options.get("attention", "sdpa")):  # forward and backward, as the trainer
            logits = model(input_ids=tokens).logits
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / dist.get_world_size())
    return losses, fast_paths.taken(model, options.get("attention", "sdpa")) | {
        "optimizer_kernel": fast_paths.optimizer_kernel(optimizer),
        "graphs_compiled": fast_paths.compiled_graphs() - graphs,
    }


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    results = {
        name: dict(zip(("losses", "taken"), train(options, mesh, rank), strict=True)) for name, options in PATHS.items()
    }
    if rank == 0:
        print(json.dumps(results), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
