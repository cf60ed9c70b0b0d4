"""One Accelerator for GPUs and CPUs, FSDP2 where asked, and a guard that sharding really happened.

Stock Accelerate only enables FSDP for accelerator backends (CUDA, XPU, ...). On a CPU-only host it
reports MULTI_CPU and `prepare` silently builds DDP instead, ignoring the FSDP plugin. Without the
`cpu=True` flag it is worse: every process believes it is rank 0 and trains its own copy. Here, on
CPU hosts, the shared Accelerate state is switched to FSDP (gloo backend, device `cpu`) before
`prepare`, so the CPU and GPU paths run the same `prepare` and the same FSDP2 `fully_shard`. This
touches Accelerate's shared-state dictionaries, so accelerate is pinned and `verify_sharding` checks
the result on every run: a model that is not what was asked for stops the job with an error.

Strategy mapping onto FSDP2 (`fully_shard`), which has no strategy enum of its own:
    FULL_SHARD     shard params, grads, optimizer state; reshard after forward
    SHARD_GRAD_OP  same shards, but keep gathered params from forward to backward (ZeRO-2 like)
    HYBRID_SHARD   2-D mesh: shard within a node, replicate across nodes
    NO_SHARD       replicate everything: Accelerate's DDP
"""

from __future__ import annotations

import resource
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, InitProcessGroupKwargs

SHARDED_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD")
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0  # NCCL's default in torch; long enough for a large checkpoint barrier


class ShardingError(RuntimeError):
    """The prepared model is not distributed the way the job asked for."""


def resolve_precision(precision: str) -> str:
    """Accelerate's mixed_precision value: bf16 on GPUs that support it, fp32 ('no') on CPU."""
    if precision == "auto":
        use_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return "bf16" if use_bf16 else "no"
    return "bf16" if precision == "bf16" else "no"


def make_accelerator(
    sharding: str,
    precision: str,
    activation_checkpointing: bool = False,
    layer_cls: str | None = None,
    nodes: int = 1,
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S,
    reduce_dtype: str | None = None,
) -> Accelerator:
    """The job's Accelerator; NO_SHARD (DDP, the vision workload) needs only the precision.

    `collective_timeout_s` bounds every collective: a peer that stops answering without closing its
    connections (a hung GPU, a partitioned node) fails this rank after that long, so the agent
    restarts the group instead of the job hanging (gloo's own default is 30 minutes).
    """
    on_cpu = not torch.cuda.is_available()
    kwargs: dict = {
        "mixed_precision": resolve_precision(precision),
        "cpu": on_cpu,
        "kwargs_handlers": [InitProcessGroupKwargs(timeout=timedelta(seconds=collective_timeout_s))],
    }
    if sharding == "NO_SHARD":
        return Accelerator(**kwargs)
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        reshard_after_forward=sharding != "SHARD_GRAD_OP",
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=[layer_cls],
        state_dict_type="SHARDED_STATE_DICT",
        activation_checkpointing=activation_checkpointing,
        # Rank 0's weights are broadcast into every rank's shards (the others build shapes only).
        cpu_ram_efficient_loading=True,
        mixed_precision_policy=mixed_precision_policy(kwargs["mixed_precision"], reduce_dtype),
    )
    if sharding == "HYBRID_SHARD":
        from accelerate.parallelism_config import ParallelismConfig

        world = PartialState(cpu=on_cpu).num_processes
        kwargs["parallelism_config"] = ParallelismConfig(dp_replicate_size=nodes, dp_shard_size=world // nodes)
    accelerator = Accelerator(fsdp_plugin=plugin, **kwargs)
    if on_cpu and accelerator.distributed_type == DistributedType.MULTI_CPU:
        # Accelerate gives the plugin the run's precision only when it sets up FSDP itself (accelerate/state.py,
        # AcceleratorState, v1.15.0): on accelerators. Here, as there: bf16 parameters, reductions and outputs.
        if kwargs["mixed_precision"] != "no" and plugin.mixed_precision_policy is None:
            plugin.set_mixed_precision(kwargs["mixed_precision"])
        _enable_fsdp_on_cpu(plugin)
    if accelerator.distributed_type != DistributedType.FSDP and accelerator.num_processes > 1:
        raise ShardingError(f"asked for FSDP but Accelerate set up {accelerator.distributed_type}")
    return accelerator


def mixed_precision_policy(mixed_precision: str, reduce_dtype: str | None) -> dict | None:
    """FSDP2's policy under bf16: bf16 parameters and outputs, gradients reduce-scattered in fp32 unless
    `reduce_dtype` is `bf16`. None leaves Accelerate's policy: under bf16 its reductions are bf16 too (the compute
    dtype: accelerate/utils/dataclasses.py `FullyShardedDataParallelPlugin.set_mixed_precision`, v1.15.0); in fp32
    there is none. fp32 is the default because a bf16 reduce-scatter rounds the sum of every rank's gradients to
    8 bits of mantissa, and FSDP2 then upcasts that rounded sum into the fp32 sharded gradient."""
    if mixed_precision != "bf16" or reduce_dtype == "bf16":
        return None
    return {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32, "output_dtype": torch.bfloat16}


def _enable_fsdp_on_cpu(plugin: FullyShardedDataParallelPlugin) -> None:
    # Both shared dicts: AcceleratorState re-reads PartialState's whenever it is constructed again.
    for shared in (AcceleratorState._shared_state, PartialState._shared_state):
        shared["distributed_type"] = DistributedType.FSDP
        shared["device"] = torch.device("cpu")
    AcceleratorState._shared_state["fsdp_plugin"] = plugin


def local_parameter_share(model: torch.nn.Module) -> tuple[int, int]:
    """(elements this rank stores, elements of the full model) over all parameters."""
    from torch.distributed.tensor import DTensor

    local = total = 0
    for param in model.parameters():
        total += param.numel()
        local += param.to_local().numel() if isinstance(param, DTensor) else param.numel()
    return local, total


def verify_sharding(model: torch.nn.Module, sharding: str, world_size: int, shard_group_size: int) -> dict:
    """Stop the job unless the prepared model is distributed as asked. Returns what was found.

    FSDP strategies: every parameter must be a DTensor and this rank must hold about
    1/shard_group_size of the elements. NO_SHARD: the model must be wrapped in DDP, so gradients are
    averaged. A single-process job has nothing to check.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    local, total = local_parameter_share(model)
    found = {"strategy": sharding, "local_params": local, "total_params": total, "world_size": world_size}
    if world_size == 1:
        return found
    if sharding == "NO_SHARD":
        if not isinstance(model, DistributedDataParallel):
            raise ShardingError(f"NO_SHARD expects a DDP-wrapped model, got {type(model).__name__}")
        return found
    if not isinstance(model, FSDPModule):
        raise ShardingError(
            f"{sharding} requested but the model is {type(model).__name__}, not FSDP-sharded: "
            "training would run unsynchronised or replicated copies"
        )
    expected = total / shard_group_size
    # Uneven dim-0 splits pad the last rank; allow a few percent either way.
    if not 0.9 * expected <= local <= 1.1 * expected:
        raise ShardingError(
            f"{sharding}: this rank holds {local} of {total} parameter elements, expected about {expected:.0f} "
            f"(1/{shard_group_size})"
        )
    return found


def on_any_rank(*flags: bool, device: torch.device | str | None = None) -> tuple[bool, ...]:
    """Each flag as true when it holds on any rank: one MAX all-reduce, on `device` or the process group's own (NCCL's
    is a GPU); in a single process the flags as they are."""
    grouped = torch.distributed.is_available() and torch.distributed.is_initialized()
    if device is None:
        nccl = grouped and torch.distributed.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    values = torch.tensor([float(flag) for flag in flags], device=device)
    if grouped:
        torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.MAX)
    return tuple(bool(value) for value in values.tolist())


def synchronize() -> None:
    """Wait for the GPU's queued work (a timer's edge); nothing to wait for on CPU."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_memory_bytes() -> int:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
