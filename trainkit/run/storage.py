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
    LoRA         the checkpoint holds the adapters and their AdamW moments only (12 bytes an adapter parameter:
                 the frozen base is read from its source at every start); the export is PEFT's adapter folder
                 (4 bytes an adapter parameter), and with --export merged the whole model too.

`invoke bench runs` records what a real run wrote beside this prediction (benchmarks/runs-cpu.json, rendered in
docs/checkpoints.md). Checkpoints already in the run folder (a resumed run) count as written.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from training.common.checkpoint import CHECKPOINTS_DIR, complete_steps
from training.families import family_of, optimizer_of
from training.spec import ZERO_1
from trainkit.errors import SpecError
from trainkit.job.models import ModelEntry, get_model

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
    trained: int | None = None
    """LoRA: the adapter parameters, which alone are checkpointed (None: a full fine-tune's, every parameter)."""

    @property
    def total(self) -> int:
        return self.checkpoint_bytes * self.checkpoints + self.export_bytes

    def describe(self) -> str:
        parts = [f"{self.checkpoints} checkpoint(s) of {self.checkpoint_bytes / GB:,.1f} GB"]
        if self.export_bytes:
            parts.append(f"an export of {self.export_bytes / GB:,.1f} GB")
        trained = f", {self.trained / 1e6:,.1f} M of them trained" if self.trained is not None else ""
        return f"{self.total / GB:,.1f} GB ({' and '.join(parts)}, {self.parameters / 1e9:.2f} B parameters{trained})"


def saves(steps: int | None, interval: int | None) -> int | None:
    """How many checkpoints a run of `steps` writes (every `interval` steps and the last); None: unknown."""
    if steps is None:
        return None
    if not interval:
        return 1
    return (steps - 1) // interval + 1


def storage_need(job, entry: ModelEntry, existing: int = 0) -> StorageNeed:
    family = family_of(entry.family)
    if family.text:
        parameters = entry.arch.truncated(job.model.layers).parameters()
    else:
        parameters = entry.arch.parameters
    optimizer = optimizer_of(family, job.optimisation.optimizer)
    export = PARAM_BYTES * parameters if family.exports else 0  # BERT, vision: the checkpoint is the result
    master = MASTER_BYTES if job.parallelism.sharding == ZERO_1 else 0
    lora = job.lora
    trained = None
    if lora.enabled and family.text:  # training/common/training_state.py AdapterCheckpoint; training/llm/lora.py
        trained = entry.arch.truncated(job.model.layers).shape().adapter_params(lora.rank, lora.target_names)
        export = PARAM_BYTES * trained + (export if lora.export == "merged" else 0)
    checkpoint = (PARAM_BYTES + master + OPTIMIZER_BYTES[optimizer]) * (parameters if trained is None else trained)
    peak = job.checkpointing.keep_checkpoints + 1
    written = saves(job.optimisation.steps, job.checkpointing.checkpoint_interval)
    if written is not None:
        peak = min(peak, written)
    return StorageNeed(parameters, checkpoint, max(peak - existing, 0), export, trained)


SLOW_DISK_MB_S = 100.0
"""A slow disk's write throughput (a single hard disk's sequential rate): a phase whose bytes fit in the watchdog's
least allowance even at this rate needs no measurement."""
PROBE_BYTES = 256 * 2**20
"""What `measure_write_mb_s` writes: large enough that the page cache's first burst does not pass for the disk's
rate (it is written with fsync), small enough to take a second or two on a slow disk."""
GP3_BASELINE_MB_S = 125 * 2**20 / 1e6
"""An EBS gp3 volume's baseline throughput, 125 MiB/s (Amazon EBS User Guide, "Amazon EBS General Purpose SSD
volumes": gp3 "baseline ... 125 MiB/s"): what a SageMaker job's checkpoints are assumed to be written at."""


def measure_write_mb_s(folder: Path, size: int = PROBE_BYTES) -> float:
    """The write throughput of the disk under `folder` (its nearest existing parent), MB/s: `size` bytes written and
    fsynced to a file there, then removed."""
    import os
    import tempfile
    import time

    block = os.urandom(2**20)
    handle, name = tempfile.mkstemp(prefix=".trainkit-write-probe-", dir=_existing_folder(folder))
    try:
        started = time.perf_counter()
        written = 0
        while written < size:
            written += os.write(handle, block)
        os.fsync(handle)
        seconds = time.perf_counter() - started
    finally:
        os.close(handle)
        os.unlink(name)
    return written / 1e6 / max(seconds, 1e-6)


def fsx_mb_s(capacity_gib: int | None, per_tib: int | None) -> float | None:
    """FSx for Lustre PERSISTENT_2's throughput: its per-unit storage throughput (MB/s per TiB) times its storage
    capacity (AWS, FSx for Lustre User Guide, "Performance": throughput scales with storage capacity)."""
    if not capacity_gib:
        return None
    return float(per_tib or FSX_DEFAULT_PER_TIB) * capacity_gib / 1024


FSX_DEFAULT_PER_TIB = 250
"""terraform/stacks/infra/variables.tf fsx_throughput_per_tib's default, for outputs recorded before they said it."""


def needs_measuring(job) -> bool:
    """Whether a phase of the run writes so much that even a slow disk's rate might not fit it in the watchdog's
    least allowance (a tiny or small model never does: no probe for it)."""
    from trainkit.run.watchdog import SLOW_PHASE_S, WRITE_MARGIN

    largest = max(job.checkpointing.phase_bytes.values(), default=0)
    return largest / (SLOW_DISK_MB_S * 1e6) * WRITE_MARGIN > SLOW_PHASE_S


def plan_slow_phases(job, default_mb_s, hosts=lambda job: 1) -> None:
    """Set what the stall watchdog needs to allow a checkpoint and the export their time (trainkit/run/watchdog.py:
    `budgets`): the bytes of each, the storage's throughput when --storage-mb-s left it open (`default_mb_s(job)`:
    the target's) and how many hosts write a checkpoint's parts to volumes of their own (`hosts(job)`); say the
    allowances in the run's notes where the bytes decide them."""
    from trainkit.run.watchdog import budgets, describe_budget

    c = job.checkpointing
    c.phase_bytes = phase_bytes(job)
    if not c.phase_bytes or job.elastic.stall_timeout == 0:
        return
    if c.storage_mb_s is None:
        c.storage_mb_s = default_mb_s(job)
    c.storage_hosts = hosts(job)
    planned = budgets(job.elastic.stall_timeout, c.phase_bytes, c.storage_mb_s, c.storage_hosts)
    floor = budgets(job.elastic.stall_timeout)
    if any(planned[phase] != floor[phase] for phase in c.phase_bytes):  # else the documented least: nothing to say
        job.run.notes.append(
            "stall watchdog: " + "; ".join(describe_budget(phase, planned[phase]) for phase in c.phase_bytes)
        )


def phase_bytes(job) -> dict[str, int]:
    """What a recipe run writes in each of the stall watchdog's slow phases (trainkit/run/watchdog.py): a checkpoint;
    at the end the last checkpoint and the export together (training/common/trainer.py beats `export` before both).
    Nothing for another workload (its checkpoints are its own) or a model the table does not know."""
    if job.run.workload != "recipe":
        return {}
    try:
        need = storage_need(job, get_model(job.model.name))
    except (SpecError, KeyError):
        return {}
    return {"checkpoint": need.checkpoint_bytes, "export": need.checkpoint_bytes + need.export_bytes}


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
