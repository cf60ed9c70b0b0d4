"""Run under torchrun --nproc-per-node 2: the sharding guard must refuse every silent fallback."""

import torch

from training.common import distributed


def expect_refusal(action, what: str) -> None:
    try:
        action()
    except distributed.ShardingError as error:
        print(f"refused {what}: {error}", flush=True)
        return
    raise SystemExit(f"guard let {what} through")


# 1. Stock Accelerate on CPU: FSDP asked for, MULTI_CPU (DDP) set up. Must stop before training.
enable = distributed._enable_fsdp_on_cpu
distributed._enable_fsdp_on_cpu = lambda plugin: None
expect_refusal(
    lambda: distributed.make_accelerator("FULL_SHARD", "fp32", False, "LlamaDecoderLayer", 1),
    "Accelerate's DDP fallback",
)
distributed._enable_fsdp_on_cpu = enable

model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
# 2. A model nobody wrapped: each rank would train its own copy.
expect_refusal(lambda: distributed.verify_sharding(model, "FULL_SHARD", 2, 2), "independent copies")
# 3. A replicated (DDP) model where sharding was asked for.
ddp = torch.nn.parallel.DistributedDataParallel(model)
expect_refusal(lambda: distributed.verify_sharding(ddp, "FULL_SHARD", 2, 2), "DDP instead of FSDP")
# 4. NO_SHARD without DDP: unsynchronised copies.
expect_refusal(lambda: distributed.verify_sharding(model, "NO_SHARD", 2, 1), "NO_SHARD without DDP")
distributed.verify_sharding(ddp, "NO_SHARD", 2, 1)  # the honest replicated case passes
print("guard ok", flush=True)
