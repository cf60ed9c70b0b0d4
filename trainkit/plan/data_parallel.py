"""What every GPU holds under the strategies that keep the whole model on every GPU, DeepSpeed ZeRO stage 1
(`--sharding ZERO_1`, BERT's) and DDP (`NO_SHARD`), and the DeepSpeed defaults the planner (memory.py) and the
scaling model (scaling_model.py) read. Bytes per GPU, Ψ parameters (the registry's exact count), N_d data-parallel
ranks, bf16 training on the plan's GPUs.

ZeRO-1 (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
arXiv:1910.02054, section 5.1 and figure 1): mixed precision keeps 2Ψ of 16-bit parameters, 2Ψ of gradients and
KΨ of optimizer state, K = 12 for Adam (fp32 master parameters, momentum, variance); stage 1 partitions only the
optimizer state: 2Ψ + 2Ψ + KΨ/N_d. LAMB and AdamW, trainkit's BERT optimizers, keep the same two fp32 moments:
K = 12 for both.

    parameters   2Ψ            the bf16 model on every GPU (DeepSpeed casts the module to bf16)
    gradients    2Ψ + 4Ψ       each micro batch's bf16 gradients, added into an fp32 buffer of the whole model
                               (training/common/zero.py sets `data_types.grad_accum_dtype` fp32, so ZeRO-1 runs as
                               runtime/bf16_optimizer.py's BF16_Optimizer: `fp32_groups_gradients_flat`, one per
                               parameter group, `update_hp_grads`); this rank's partition of it is a view
    optimizer    12Ψ/N_d       fp32 master weights and the two fp32 moments of this rank's partition
    buckets      4 x min(Ψ, 5e8)  the all-reduce's flat copy: at the step the engine reduces the fp32 buffers in
                               buckets that close once past 5e8 elements (engine.py `buffered_allreduce_fallback`,
                               MEMORY_OPT_ALLREDUCE_SIZE; `allreduce_no_retain`), and `allreduce_bucket` flattens each
                               bucket into a new tensor, in fp32 as `communication_data_type` says. The updated
                               partitions are gathered into the flat bf16 parameter buffer in place
                               (bf16_optimizer.py `update_lp_params` -> runtime/utils.py `all_gather_dp_groups`)

DeepSpeed 0.19.8 (the pinned version; its defaults in deepspeed/runtime/zero/config.py, `DeepSpeedZeroConfig`), as
training/common/zero.py configures it: `"zero_optimization": {"stage": 1}`, bf16, everything else DeepSpeed's own.

DDP (NO_SHARD: Accelerate's DistributedDataParallel, bf16 autocast over an fp32 model): fp32 parameters, gradients
and two fp32 moments on every GPU, and the reducer's buckets: a second copy of every gradient, since
`gradient_as_bucket_view` is false by default (torch/nn/parallel/distributed.py: with it true "the saved memory
size will be equal to the total gradients size"; Accelerate passes no DDP arguments here).
"""

from __future__ import annotations

from training.spec import ZERO_1

ADAM_STATE_BYTES = 12
"""K of the ZeRO paper: bytes of optimizer state per parameter, fp32 master weights and two fp32 moments."""
DS_REDUCE_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed 0.19.8's all-reduce bucket at the step (engine.py MEMORY_OPT_ALLREDUCE_SIZE, 5e8 elements)."""
DS_COMMUNICATION_BYTES = 4
"""fp32: the gradients are reduced in fp32 (training/common/zero.py's `communication_data_type`); the weights are
gathered in bf16."""
DATA_PARALLEL = (ZERO_1, "NO_SHARD")
"""The strategies this module sizes (every GPU computes with the whole model)."""


def state_bytes(sharding: str, params: int, world: int) -> dict[str, float]:
    """Bytes per GPU of parameters, gradients, optimizer state and communication buckets for `params` parameters
    on `world` data-parallel ranks under ZERO_1, else NO_SHARD (DDP); the module's docstring says where each term
    comes from."""
    if sharding == ZERO_1:
        return {
            "parameters": 2 * params,
            "gradients": 2 * params + 4 * params,
            "optimizer": ADAM_STATE_BYTES * params / world,
            "buckets": DS_COMMUNICATION_BYTES * min(params, DS_REDUCE_BUCKET_ELEMENTS),
        }
    return {"parameters": 4 * params, "gradients": 4 * params, "optimizer": 8 * params, "buckets": 4 * params}
