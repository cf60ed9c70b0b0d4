"""DeepSpeed ZeRO stage 1 for the data-parallel recipes (BERT's `--sharding ZERO_1`): the engine, the optimizer it
partitions, its checkpoint inside trainkit's atomic publish, and the check that the optimizer state really is
partitioned.

One path on CPUs and GPUs: DeepSpeed's own engine (`deepspeed.initialize`) under torchrun, over the process group
the Accelerator already made. Accelerate's DeepSpeed integration is gated off on CPU (accelerate/state.py: under
`cpu=True` the DeepSpeed plugin is not used), so the CPU tests could not run the path a GPU job would take; and its
`backward` also steps the engine, where the trainers here step once per global batch (training/common/trainer.py).
With `managed_gradient_accumulation: false` DeepSpeed leaves the boundary to the caller: each micro batch's
backward accumulates locally, `engine.step()` reduces the gradients, clips, steps the optimizer on this rank's
partition and copies the updated weights back to every rank (DeepSpeed 0.19.8, runtime/engine.py `step`).

ZeRO-1 (Rajbhandari et al. 2020, arXiv:1910.02054, section 5.1): each parameter group is flattened into one buffer,
and each data-parallel rank keeps the fp32 master weights and optimizer moments of one contiguous slice of it. LAMB
then needs each parameter's whole norm, not its slice's: `PartitionLamb` (training/common/sharded_lamb.py) gets the
layout of each rank's slice from DeepSpeed's optimizer here.

Checkpoints: `engine.save_checkpoint` writes DeepSpeed's own files (`zero/mp_rank_00_model_states.pt` by the first
rank, `zero/*zero_pp_rank_<r>_mp_rank_00_optim_states.pt` by every rank) into the checkpoint's temporary folder;
trainkit's CheckpointManager publishes it (manifest, marker, rename, `latest`), so a kill at any moment leaves the
previous checkpoint. The schedule's state travels as DeepSpeed's client state, each rank's RNG states beside.
A checkpoint holds one optimizer file per rank of the world that wrote it, and DeepSpeed refuses to load ZeRO-1's
optimizer state at another world size (runtime/engine.py `_get_all_zero_checkpoints`: "Automatic adjustment of
ZeRO's optimizer state partitioning with a new world size is not currently supported"). An elastic job that
resumes with another number of ranks therefore goes through DeepSpeed's universal checkpoint (DeepSpeed's
"Universal Checkpointing" tutorial; deepspeed/checkpoint/ds_to_universal.py): the checkpoint is converted once into
one file per parameter and state (`fp32`, `exp_avg`, `exp_avg_sq`, `step`: PartitionLamb keeps Adam's names for
this), under `checkpoints/.universal/<step>/`, by the rank that owns the disk (the main rank on a shared file
system, each host's first rank where hosts have their own), and every rank loads its new slice from it with the
engine's `load_universal` switched on for that load. The published checkpoint stays as it was.

DeepSpeed unpickles every file it reads with weights_only=False, and offers no option against it; RunContext loads a
ZeroCheckpoint, the conversion included, with torch forced to weights-only loads and `safe_globals` added
(training/common/weights_only.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import random
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from .checkpoint import this_rank_owns_disk
from .distributed import ShardingError, on_any_rank
from .sharded_lamb import Fragment, PartitionLamb, partition_fragments
from .weights_only import NUMPY_RNG_STATE

TAG = "zero"
"""The folder DeepSpeed writes inside a checkpoint (its `tag`)."""
OPTIMIZER_FILES = "*zero_pp_rank_*_mp_rank_00_optim_states.pt"
"""One per data-parallel rank (bf16 runs prefix them `bf16_`)."""
PRINT_NEVER = 1 << 30


def engine_config(micro_batch_size: int, micro_steps: int, grad_clip: float, bf16: bool) -> dict:
    """DeepSpeed's configuration for a ZeRO-1 job (keys: DeepSpeed's config-json documentation)."""
    config = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": micro_steps,
        "managed_gradient_accumulation": False,
        "gradient_clipping": grad_clip,
        "bf16": {"enabled": bf16},
        "zero_optimization": {"stage": 1},
        # Our optimizers (LAMB on partitions, torch's AdamW) are not DeepSpeed's own: it asks for this to take them.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": PRINT_NEVER,
        "wall_clock_breakdown": False,
    }
    if bf16:
        # Under bf16 DeepSpeed accumulates the micro batches' gradients in the model's dtype (engine.py
        # `get_data_types`) and reduces them in bf16 (`communication_data_type`). fp32 for both instead: with
        # `grad_accum_dtype` fp32 the ZeRO-1 optimizer is BF16_Optimizer (engine.py `_do_optimizer_sanity_check`),
        # which adds each micro batch's bf16 gradients into an fp32 buffer (bf16_optimizer.py `update_hp_grads`)
        # that the step all-reduces (`buffered_allreduce_fallback`, in fp32 as `communication_data_type` says).
        config["data_types"] = {"grad_accum_dtype": "fp32"}
        config["communication_data_type"] = "fp32"
    return config


def _import_deepspeed():
    """deepspeed, told the accelerator (its own detection logs a warning on every CPU rank) and kept quiet."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    import deepspeed
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)
    return deepspeed


def initialize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: dict):
    """The DeepSpeed engine over `model` (moved to this rank's device) with `optimizer` partitioned by ZeRO-1,
    joining the process group that already exists."""
    deepspeed = _import_deepspeed()
    # BF16_Optimizer prints its set-up's memory to stdout (runtime/utils.py `see_memory_usage`, forced); its
    # warnings and errors go to DeepSpeed's logger on stderr.
    with contextlib.redirect_stdout(io.StringIO()):
        engine, _optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=config, dist_init_required=False
        )
    if isinstance(optimizer, PartitionLamb):
        zero = engine.optimizer
        group = zero.dp_process_group
        optimizer.bind(partition_layout(zero), lambda sums: _all_reduce(sums, group))
    return engine


def _all_reduce(values: torch.Tensor, group) -> torch.Tensor:
    dist.all_reduce(values, group=group)
    return values


def partition_layout(zero) -> list[tuple[list[Fragment], int]]:
    """Per parameter group of DeepSpeed's ZeRO-1 optimizer: what this rank's slice of the flat buffer holds, and how
    many parameters the group has. Rank r owns [r * partition_size, (r + 1) * partition_size) of the group's buffer.

    - DeepSpeedZeroOptimizer (runtime/zero/stage_1_and_2.py, gradients reduced in the model's dtype): the buffer lays
      the parameters out in `round_robin_bit16_groups` order at `round_robin_bit16_offsets` (with alignment padding
      between them).
    - BF16_Optimizer (runtime/bf16_optimizer.py `_setup_for_real_optimizer`, bf16 with fp32 gradient accumulation):
      `bf16_groups_flat` holds `bf16_groups` end to end, padded at the end only (`_flatten_dense_tensors_aligned`),
      and this rank's fp32 slice is `fp32_groups_flat_partition`."""
    bf16 = hasattr(zero, "bf16_groups_flat")
    layout = []
    for index, held in enumerate(flat.numel() for flat in master_partitions(zero)):
        group = zero.real_dp_process_group[index]
        if bf16:
            sizes = [tensor.numel() for tensor in zero.bf16_groups[index]]
            size = zero.bf16_groups_flat[index].numel() // dist.get_world_size(group=group)
            offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        else:
            sizes = [meta.numel() for meta in zero.round_robin_bit16_meta[index]]
            size, offsets = int(zero.partition_size[index]), list(zero.round_robin_bit16_offsets[index])
        rank = dist.get_rank(group=group)
        if held != size:
            raise RuntimeError(f"DeepSpeed's partition {index} holds {held} elements, its layout says {size}")
        layout.append((partition_fragments(offsets, sizes, rank * size, size), len(sizes)))
    return layout


def master_partitions(zero) -> list[torch.Tensor]:
    """This rank's fp32 master slices, one per parameter group, of either ZeRO-1 optimizer (partition_layout)."""
    return (
        zero.fp32_groups_flat_partition if hasattr(zero, "bf16_groups_flat") else zero.single_partition_of_fp32_groups
    )


def optimizer_share(engine) -> tuple[int, int]:
    """(fp32 master elements this rank keeps, the model's parameter elements): ZeRO-1's optimizer share."""
    local = sum(flat.numel() for flat in master_partitions(engine.optimizer))
    total = sum(param.numel() for param in engine.module.parameters())
    return local, total


def verify_partitioned(engine, world: int) -> dict:
    """Stop the job unless this rank keeps about 1/world of the optimizer's master weights (DeepSpeed pads each group
    to a multiple of the world, so a little more); what was found, for the run's report."""
    local, total = optimizer_share(engine)
    found = {"strategy": "ZERO_1", "local_optimizer_elements": local, "total_params": total, "world_size": world}
    expected = total / world
    if world > 1 and not 0.9 * expected <= local <= 1.1 * expected + 64 * len(master_partitions(engine.optimizer)):
        raise ShardingError(
            f"ZERO_1: this rank keeps {local} of {total} optimizer elements, expected about {expected:.0f} (1/{world})"
        )
    return found


def saved_world_size(checkpoint: Path) -> int:
    """How many data-parallel ranks wrote a ZeRO-1 checkpoint: its optimizer files, one per rank."""
    return len(list((checkpoint / TAG).glob(OPTIMIZER_FILES)))


class ZeroCheckpoint:
    """What RunContext saves and loads for a DeepSpeed engine (see the module's docstring), weights-only."""

    def __init__(self, engine, scheduler: torch.optim.lr_scheduler.LRScheduler, world: int, rank: int):
        self.engine, self.scheduler, self.world, self.rank = engine, scheduler, world, rank

    @property
    def safe_globals(self) -> tuple:
        """Beyond tensors and plain data, the optimizer files hold three of DeepSpeed's classes
        (deepspeed/runtime/zero/stage_1_and_2.py:3370-3397, `state_dict`; BF16_Optimizer's,
        deepspeed/runtime/bf16_optimizer.py:629-637, only the first), each a holder of numbers whose unpickling sets
        attributes and calls nothing: `fragment_address`, a dataclass of two ints (deepspeed/utils/tensor_fragment.py
        :12-15), one per parameter; `ZeroStageEnum`, an int Enum (deepspeed/runtime/zero/config.py:81-87);
        `LossScaler`, the static scale of a run not in fp16, a number and a bool (deepspeed/runtime/fp16/loss_scaler.py
        :134-191, CreateLossScaler :293-299; trainkit never trains in fp16, so DynamicLossScaler is not allowed). The
        RNG files beside hold numpy's state (NUMPY_RNG_STATE)."""
        _import_deepspeed()
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        return (fragment_address, ZeroStageEnum, LossScaler, *NUMPY_RNG_STATE)

    def save(self, directory: Path) -> None:
        """`directory`: the checkpoint being written, in the checkpoints' folder; a universal copy left there by a
        resume whose load failed goes (every rank saves after its load)."""
        if this_rank_owns_disk(self.rank):
            shutil.rmtree(directory.parent / UNIVERSAL_DIR, ignore_errors=True)
        self.engine.save_checkpoint(
            str(directory), tag=TAG, client_state={"scheduler": self.scheduler.state_dict()}, save_latest=False
        )
        torch.save(_rng_state(), directory / TAG / f"rng_state_{self.rank}.pt")

    def load(self, directory: Path) -> None:
        saved = saved_world_size(directory)
        source, universal = directory, saved != self.world
        if universal:
            source = universal_copy(directory, saved, self.world, self.rank)
        failed: BaseException | None = None
        try:
            with _universal_load(self.engine, universal):
                path, client = self.engine.load_checkpoint(
                    str(source), tag=TAG, load_optimizer_states=True, load_lr_scheduler_states=False
                )
            if path is None:
                raise FileNotFoundError(f"DeepSpeed found no checkpoint under {source / TAG}")
        except Exception as error:
            if not universal:
                raise
            failed = error
        if universal:
            # Every rank past its load, or told that one failed: then each raises, and the resume sets the checkpoint
            # aside together (RunContext._unusable); a plain barrier here would never meet a rank that raised. When
            # all loaded, the copy has served and goes (a later failure converts again).
            if on_any_rank(failed is not None)[0]:
                if failed is not None:
                    raise failed
                raise RuntimeError(f"DeepSpeed's universal copy of {directory.name} did not load on another rank")
            if this_rank_owns_disk(self.rank):
                shutil.rmtree(source.parent, ignore_errors=True)
        self.scheduler.load_state_dict(client["scheduler"])
        rng = directory / TAG / f"rng_state_{self.rank}.pt"
        if rng.is_file():  # a rank the writing world did not have keeps the seed it started from
            # numpy's state needs NUMPY_RNG_STATE, among the safe_globals RunContext's load allows
            _set_rng_state(torch.load(rng, weights_only=True))


UNIVERSAL_DIR = ".universal"


def universal_copy(checkpoint: Path, saved: int, world: int, rank: int) -> Path:
    """DeepSpeed's universal form of `checkpoint` (written by `saved` ranks), made once by the rank that owns this
    disk and read by every rank after a barrier: its folder (DeepSpeed's `save_dir`, holding `<TAG>/`)."""
    folder = checkpoint.parent / UNIVERSAL_DIR / checkpoint.name
    failed: BaseException | None = None
    if this_rank_owns_disk(rank):
        print(
            f"checkpoint {checkpoint.name} was written by {saved} ranks and this job has {world}: converting it to "
            f"DeepSpeed's universal checkpoint ({folder})",
            flush=True,
        )
        shutil.rmtree(folder.parent, ignore_errors=True)  # an older step's conversion: no longer wanted
        try:
            convert_to_universal(checkpoint / TAG, folder / TAG)
        except Exception as error:  # said to every rank below, so none waits for a conversion that will not come
            failed = error
    # The barrier before anyone reads the copy, and the outcome: a rank that waited in a plain barrier for an owner
    # whose conversion raised would wait out the collective timeout (the owner goes on to the resume's agreement).
    if on_any_rank(failed is not None)[0]:
        if failed is not None:
            raise failed
        raise RuntimeError(f"DeepSpeed's universal conversion of {checkpoint.name} failed on the rank that made it")
    return folder


def convert_to_universal(zero_folder: Path, output: Path) -> None:
    """ds_to_universal.py's conversion in this process (one worker: no child processes inside a training rank)."""
    _import_deepspeed()
    from deepspeed.checkpoint import ds_to_universal

    options = {"num_extract_workers": 1, "num_merge_workers": 1, "keep_temp_folder": False, "strict": True}
    arguments = argparse.Namespace(input_folder=str(zero_folder), output_folder=str(output), **options)
    arguments.inject_missing_state = True  # our checkpoints carry no Megatron-style universal info of their own
    ds_to_universal.main(arguments)


@contextlib.contextmanager
def _universal_load(engine, universal: bool):
    """The engine's `checkpoint.load_universal` for one load: DeepSpeed reads it from its config when it loads
    (runtime/engine.py `load_universal_checkpoint`), and the job's next save and load are ordinary ones."""
    config = engine._config
    before = config.load_universal_checkpoint
    config.load_universal_checkpoint = universal
    try:
        yield
    finally:
        config.load_universal_checkpoint = before


def _rng_state() -> dict:
    import numpy

    state = {"python": random.getstate(), "numpy": numpy.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    import numpy

    random.setstate(state["python"])
    numpy.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
