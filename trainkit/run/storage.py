"""The disk a run will write, checked before it starts: a run that fills its disk at a checkpoint or at
the export loses the hours before it (the save fails; the previous checkpoint survives, the time does
not).

What a run writes, per the trainers:

    checkpoint   every parameter in fp32 (4 bytes) plus the optimizer's fp32 state: AdamW keeps two
                 moments (8 bytes), SGD with momentum one (4), LAMB two (8). FSDP shards it across
                 ranks; the shards add up to the same total on the shared disk. DeepSpeed ZeRO-1 also
                 saves its fp32 master weights (4); its module weights are counted as fp32 (bf16 jobs
                 write 2 bytes of them: a little to spare).
    in flight    a new checkpoint is written in full before the oldest is pruned, so the disk holds
                 `keep + 1` of them at the peak -- or fewer when the run saves fewer times than that.
    export       the LLM's consolidated weights at the end, fp32 safetensors (4 bytes a parameter).

`invoke bench runs` records what a real run wrote beside this prediction (benchmarks/runs-cpu.json, rendered in
docs/checkpoints.md). Checkpoints already in the run folder (a resumed run) count as written.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from training.common.checkpoint import CHECKPOINTS_DIR, complete_steps
from training.common.job import LANGUAGE, ZERO_1
from trainkit.errors import SpecError
from trainkit.job.models import ModelEntry

GB = 1e9
GIB = 2**30
PARAM_BYTES = 4
OPTIMIZER_BYTES = {"adamw": 8, "sgd": 4, "lamb": 8}
MASTER_BYTES = 4
"""DeepSpeed ZeRO-1 saves the module's weights and, with the optimizer's slices, its fp32 master copy of them."""


@dataclass(frozen=True)
class StorageNeed:
    parameters: int
    checkpoint_bytes: int
    checkpoints: int
    """Checkpoints on disk at the peak that are still to be written."""
    export_bytes: int

    @property
    def total(self) -> int:
        return self.checkpoint_bytes * self.checkpoints + self.export_bytes

    def describe(self) -> str:
        parts = [f"{self.checkpoints} checkpoint(s) of {self.checkpoint_bytes / GB:,.1f} GB"]
        if self.export_bytes:
            parts.append(f"an export of {self.export_bytes / GB:,.1f} GB")
        return f"{self.total / GB:,.1f} GB ({' and '.join(parts)}, {self.parameters / 1e9:.2f} B parameters)"


def saves(steps: int | None, interval: int | None) -> int | None:
    """How many checkpoints a run of `steps` writes (every `interval` steps and the last); None: unknown."""
    if steps is None:
        return None
    if not interval:
        return 1
    return (steps - 1) // interval + 1


def storage_need(job, entry: ModelEntry, existing: int = 0) -> StorageNeed:
    if entry.family in LANGUAGE:
        parameters = entry.arch.truncated(job.model.layers).parameters()
        if entry.family == "decoder":
            optimizer, export = "adamw", PARAM_BYTES * parameters
        else:  # BERT: nothing exported, the checkpoint is the result
            optimizer, export = job.optimisation.optimizer or "lamb", 0
    else:
        parameters, optimizer, export = entry.arch.parameters, job.optimisation.optimizer or "sgd", 0
    master = MASTER_BYTES if job.parallelism.sharding == ZERO_1 else 0
    checkpoint = (PARAM_BYTES + master + OPTIMIZER_BYTES[optimizer]) * parameters
    peak = job.checkpointing.keep_checkpoints + 1
    written = saves(job.optimisation.steps, job.checkpointing.checkpoint_interval)
    if written is not None:
        peak = min(peak, written)
    return StorageNeed(parameters, checkpoint, max(peak - existing, 0), export)


def _existing_folder(path: Path) -> Path:
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    return path


def check_free_space(job, entry: ModelEntry) -> StorageNeed:
    """The run's folder must have room for what the run writes (local disk, or FSx inside a pod)."""
    existing = len(complete_steps(Path(job.run_dir) / CHECKPOINTS_DIR))
    need = storage_need(job, entry, existing)
    folder = _existing_folder(job.run_dir)
    free = shutil.disk_usage(folder).free
    if need.total > free:
        raise SpecError(
            f"run {job.run.run_id} writes about {need.describe()} and {folder} has {free / GB:,.1f} GB free: "
            f"free some space, keep fewer checkpoints (--keep-checkpoints, now "
            f"{job.checkpointing.keep_checkpoints}), or "
            "put the run on a larger disk (--runs-dir)"
        )
    return need


def fsx_capacity_for(need_bytes: int) -> int:
    """The smallest FSx for Lustre capacity (GiB) the infra stack accepts that holds `need_bytes`."""
    gib = need_bytes / GIB
    return 1200 if gib <= 1200 else 2400 * math.ceil(gib / 2400)


def check_fsx_capacity(job, entry: ModelEntry, capacity_gib: int) -> StorageNeed:
    """On EKS the run lands on the shared FSx file system: what it writes must fit in all of it."""
    need = storage_need(job, entry)
    if need.total > capacity_gib * GIB:
        raise SpecError(
            f"run {job.run.run_id} writes about {need.describe()} = {need.total / GIB:,.0f} GiB and the FSx file "
            f"system holds {capacity_gib:,} GiB in all: keep fewer checkpoints (--keep-checkpoints, now "
            f"{job.checkpointing.keep_checkpoints}), or set fsx_storage_capacity_gib = "
            f"{fsx_capacity_for(need.total)} in "
            "terraform/stacks/infra/terraform.tfvars and run `make up PROFILE=aws`"
        )
    return need
