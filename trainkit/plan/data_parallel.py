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
    gradients    2Ψ + 4Ψ/N_d   bf16 gradients (`data_types.grad_accum_dtype` unset: the model's dtype, engine.py
                               `get_data_types`), and at the step this rank's partition of them upcast to fp32
                               (runtime/zero/stage_1_and_2.py `step`, `single_grad_partition`)
    optimizer    12Ψ/N_d       fp32 master weights and the two fp32 moments of this rank's partition
    buckets      2 x 5e8       one reduce bucket: `reduce_bucket_size` defaults to 5e8 elements and, with
                               `contiguous_gradients` (default true), DeepSpeed allocates one buffer of that many
                               elements in the gradients' dtype (stage_1_and_2.py `setup_buckets`; a second one
                               only with `overlap_comm`, false by default below stage 3: zero/config.py
                               `overlap_comm_valid`). `allgather_bucket_size` (also 5e8) allocates nothing: the
                               updated partitions are gathered into the flat bf16 parameter buffer in place
                               (runtime/utils.py `all_gather_dp_groups` -> `all_gather_into_tensor`)

DeepSpeed 0.19.8 (the pinned version; its defaults in deepspeed/runtime/zero/config.py, `DeepSpeedZeroConfig`), as
training/common/zero.py configures it: `"zero_optimization": {"stage": 1}`, bf16, everything else DeepSpeed's own.

DDP (NO_SHARD: Accelerate's DistributedDataParallel, bf16 autocast over an fp32 model): fp32 parameters, gradients
and two fp32 moments on every GPU, and the reducer's buckets: a second copy of every gradient, since
`gradient_as_bucket_view` is false by default (torch/nn/parallel/distributed.py: with it true "the saved memory
size will be equal to the total gradients size"; Accelerate passes no DDP arguments here).
"""

from __future__ import annotations

from training.common.job import ZERO_1

ADAM_STATE_BYTES = 12
"""K of the ZeRO paper: bytes of optimizer state per parameter, fp32 master weights and two fp32 moments."""
DS_REDUCE_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed 0.19.8 `zero_optimization.reduce_bucket_size` default (zero/config.py: `pp_int(5e8)` elements)."""
DS_COMMUNICATION_BYTES = 2
"""bf16: DeepSpeed reduces gradients in the model's dtype (engine.py `communication_data_type`) and gathers the
bf16 weights."""
DATA_PARALLEL = (ZERO_1, "NO_SHARD")
"""The strategies this module sizes (every GPU computes with the whole model)."""


def state_bytes(sharding: str, params: int, world: int) -> dict[str, float]:
    """Bytes per GPU of parameters, gradients, optimizer state and communication buckets for `params` parameters
    on `world` data-parallel ranks under ZERO_1, else NO_SHARD (DDP); the module's docstring says where each term
    comes from."""
    if sharding == ZERO_1:
        return {
            "parameters": 2 * params,
            "gradients": 2 * params + 4 * params / world,
            "optimizer": ADAM_STATE_BYTES * params / world,
            "buckets": DS_COMMUNICATION_BYTES * DS_REDUCE_BUCKET_ELEMENTS,
        }
    return {"parameters": 4 * params, "gradients": 4 * params, "optimizer": 8 * params, "buckets": 4 * params}
