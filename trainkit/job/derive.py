"""Fill in what the user left open, once the backend has said where the job runs. Pure: the model
recipe (its CPU-sized values on a machine without GPUs), then the values that follow from the rest
(the micro batch that fits the processes, the vision learning rate for the batch, the run id).
Each adjustment the user may want to know about is added to `job.run.notes`.
"""

from __future__ import annotations

import dataclasses

from training.families import Family, family_of, launcher_hook
from training.registry import GPU_ONLY
from training.spec import Job, all_fields, by_key
from trainkit.errors import SpecError
from trainkit.job.build import Machine, compiler_missing
from trainkit.job.held_out import derive_evaluation
from trainkit.job.models import get_model
from trainkit.job.tracking import launcher_commit
from trainkit.job.validate import validate_batch

SYNTHETIC_STEPS = 50
# Fields that are alternatives: giving one (flag or profile) drops the recipe's value for the other.
ALTERNATIVES = {"steps": "epochs", "epochs": "steps", "warmup_steps": "warmup_epochs", "warmup_epochs": "warmup_steps"}
# Loader workers where a recipe follows the CPUs (training/recipes.py `loader_workers_from_cpus`), measured in
# benchmarks/resnet50-workers-h200.json (2026-11-27: one NVIDIA H200 on a 16-core node, torch 2.11.0+cu130; resnet50
# at 224 px, batch 128, bf16, channels-last, 256 px JPEGs): 4 workers fed 3,039 images/s, 79% of on-device input
# (3,844), and 12 fed 3,746 (97%), so the workers' decoding, not the GPU, was the limit. More than 12 was not measured.
LOADER_WORKERS_MAX = 12
CPUS_KEPT = 2  # one core for the training process itself, one for the rest of the node
ROUNDING_NOTES = ("global batch ", "learning rate ")
"""How the notes of choose_global_batch and the vision rule begin: what continue_run replaces with the run's."""


def _value(job: Job, key: str):
    return by_key()[key].get(job)


def derive(job: Job, machine: Machine) -> None:
    p = job.parallelism
    if p.min_nodes is None:
        p.min_nodes = p.nodes
    if job.tracking.enabled and job.tracking.commit is None:
        job.tracking.commit = launcher_commit()
    if job.run.workload != "recipe":  # a script or the sweep: the model's recipe says nothing about it
        job.run.run_id = job.run.run_id or f"{job.run.workload}-{job.fingerprint()}"
        return
    entry = get_model(job.model.name)
    job.model.family = entry.family
    family = family_of(entry.family)
    o, p = job.optimisation, job.parallelism
    fit_micro_batch = o.micro_batch_size is None  # the recipe's micro batch may shrink; a given one may not
    batch_given, lr_given = o.global_batch_size is not None, o.lr is not None
    recipe = dataclasses.asdict(entry.recipe)
    cpu = recipe.pop("cpu")
    workers_from_cpus = recipe.pop("loader_workers_from_cpus")
    if cpu and machine.gpus_per_node == 0:
        _apply_cpu_recipe(job, cpu)
    if job.data.synthetic:
        if o.steps is None and o.epochs is None:
            o.steps = SYNTHETIC_STEPS
            job.run.notes.append(
                f"--synthetic has no epochs: running {SYNTHETIC_STEPS} steps (set --steps to change it)"
            )
        if o.warmup_steps is None and o.warmup_epochs is None:
            o.warmup_steps = 0  # no epochs to warm up over
    given = {key for key in recipe if _value(job, key) is not None}
    for key, value in recipe.items():
        pair = ALTERNATIVES.get(key)
        if value is None or key in given or (pair and pair in given):
            continue
        if key in GPU_ONLY and not _gpu_default_applies(job, machine, key):
            continue
        by_key()[key].set(job, value)
    if job.lora.enabled and not lr_given:
        o.lr = LORA_LR
        job.run.notes.append(
            f"learning rate {LORA_LR:g}, LoRA's default (the recipe's {recipe.get('lr')} is for training every "
            "weight; set --lr to change it)"
        )
    if workers_from_cpus and "loader_workers" not in given:
        _size_loader_workers(job, machine)
    if not batch_given:
        choose_global_batch(job, fit_micro_batch, scale_lr=not lr_given and family.lr_rule == "batch-sqrt")
    elif fit_micro_batch:
        o.micro_batch_size = fitted_micro_batch(o.global_batch_size, o.micro_batch_size, job.world_size)
    if family.lr_rule == "optimizer" and o.lr is None:
        o.lr = scaled_lr(o.global_batch_size, o.optimizer)
        job.run.notes.append(
            f"learning rate {o.lr:g} from the {o.optimizer} scaling rule for a global batch of "
            f"{o.global_batch_size} (set --lr to change it)"
        )
    o.lr_derived = not lr_given
    if job.model.init == "pretrained" and job.model.weights is None:
        job.model.weights = entry.hub_id
    derive_evaluation(job, family)
    job.run.notes.extend(family_notes(family, job, entry))
    if job.model.layers is not None and family.text and job.model.layers <= entry.arch.num_hidden_layers:
        full = entry.arch.num_hidden_layers
        job.model.truncated_label = f"{job.model.name} truncated to {job.model.layers} of {full} layers"
    if job.run.run_id is None:
        job.run.run_id = f"{entry.label}-{job.fingerprint()}"  # a folder's or hub id's last part: no slashes


LORA_LR = 3e-4
"""A LoRA run's learning rate when --lr is not given: adapters start at zero (B) and train far fewer weights, so they
take a larger rate than a full fine-tune (torchtune's Llama 2 7B LoRA config, recipes/configs/llama2/7B_lora.yaml:
3e-4; Hu et al. 2021 tuned 2e-4 for GPT-3's)."""


def family_notes(family: Family, job: Job, entry) -> list[str]:
    """What the model's family says at every start about a job of this model (training/families.py `launch`)."""
    notes = launcher_hook(family, "notes")
    return list(notes(job, entry)) if notes else []


def _gpu_default_applies(job: Job, machine: Machine, key: str) -> bool:
    """A recipe's GPU fast path (training/recipes.py GPU_ONLY) is taken on GPUs only, and only where it can
    run: the layer selection with checkpointing on, compiling where a compiler is (a note says when it is not)."""
    if machine.gpus_per_node == 0:
        return False
    if key == "ac_every":
        return bool(job.parallelism.activation_checkpointing)
    if key == "compile" and job.placement.target == "local":
        missing = compiler_missing(machine)
        if missing:
            job.run.notes.append(f"not compiling the layers (the recipe's GPU default): {missing}")
        return not missing
    return True


def cpu_sized_loader_workers(cpus: int, processes: int, floor: int) -> int:
    """Loader workers per training process: the node's vCPUs shared by its processes, less CPUS_KEPT, between the
    recipe's value (`floor`) and LOADER_WORKERS_MAX. p5.48xlarge, 192 / 8 - 2 = 22: 12; p4d.24xlarge, 96 / 8 - 2: 10."""
    return max(floor, min(LOADER_WORKERS_MAX, cpus // processes - CPUS_KEPT))


def _size_loader_workers(job: Job, machine: Machine) -> None:
    """The recipe's loader workers, sized from the node's CPUs on GPUs; kept where the CPUs are unknown, or with
    --synthetic (no loader). A changed value is announced."""
    data, p, cpus = job.data, job.parallelism, machine.cpus_per_node
    if machine.gpus_per_node == 0 or cpus is None or data.synthetic:
        return
    processes = machine.processes(p.nproc, p.nodes)
    workers = cpu_sized_loader_workers(cpus, processes, floor=data.loader_workers)
    if workers == data.loader_workers:
        return
    data.loader_workers = workers
    job.run.notes.append(
        f"{workers} loader workers a process: {cpus} vCPUs a node / {processes} process(es), less {CPUS_KEPT}, "
        f"at most {LOADER_WORKERS_MAX} (set --loader-workers to change it)"
    )


def _apply_cpu_recipe(job: Job, cpu: dict) -> None:
    """The recipe's CPU-sized values, for fields nobody set; the two batch sizes go together."""
    batch = ("global_batch_size", "micro_batch_size")
    skip = set(batch) if any(_value(job, key) is not None for key in batch) else set()
    applied = {key: value for key, value in cpu.items() if key not in skip and _value(job, key) is None}
    for key, value in applied.items():
        by_key()[key].set(job, value)
    if applied:
        settings = ", ".join(f"{by_key()[k].flag} {v}" for k, v in applied.items())
        job.run.notes.append(
            f"no GPU: using the CPU settings of the {job.model.name} recipe ({settings}); set them to change"
        )


def scaled_lr(global_batch_size: int, optimizer: str | None) -> float:
    """SGD: linear scaling, 0.1 per 256 images (Goyal et al. 2017). LAMB: square-root scaling from 0.005
    per 256 (You et al. 2019 scale LAMB's rate with the square root of the batch); an untuned start."""
    ratio = global_batch_size / 256
    return 0.1 * ratio if optimizer == "sgd" else 0.005 * ratio**0.5


def choose_global_batch(job: Job, fit_micro_batch: bool, scale_lr: bool) -> None:
    """The recipe's global batch is a target: each process of the (largest) world takes a whole number of
    sequences, the nearest to target / processes and at least one (or one micro batch when --micro-batch-size
    is given), so the recipe works at any node count. A batch that moved is announced, and a recipe
    learning rate follows it by the square-root rule for Adam-type optimisers (Malladi et al. 2022, "On
    the SDEs and scaling rules for adaptive gradient algorithms"); vision rates follow their own rule.
    In an elastic range the batch chosen for the largest size is kept at every size (same data, same
    gradient); where it does not divide a smaller world, ranks take shares one apart."""
    o, world = job.optimisation, job.world_size
    target, cap = o.global_batch_size, o.micro_batch_size
    share = target / world
    if share >= cap or not fit_micro_batch:  # whole micro batches per process
        per_process = max(1, round(share / cap)) * cap
    else:
        per_process = max(1, round(share))
    o.global_batch_size, o.global_batch_derived = per_process * world, True
    if fit_micro_batch:
        o.micro_batch_size = largest_share_micro_batch(job, cap)
    if o.global_batch_size == target:
        return
    note = (
        f"global batch {o.global_batch_size}: the recipe's {target} rounded to {per_process} per process x {world} "
        "processes (set --global-batch-size to choose)"
    )
    if scale_lr and o.lr is not None:
        scaled = o.lr * (o.global_batch_size / target) ** 0.5
        note += f"; learning rate {o.lr:g} -> {scaled:.3g} by the square-root rule (set --lr to choose)"
        o.lr = float(f"{scaled:.3g}")
    job.run.notes.append(note)


def largest_share_micro_batch(job: Job, cap: int) -> int:
    """The largest share of the global batch in the job's range (its smallest world's) in one pass, where a micro
    batch of `cap` allows."""
    p = job.parallelism
    return min(cap, -(-job.optimisation.global_batch_size // (p.min_nodes * int(p.nproc or 1))))


def fitted_micro_batch(global_batch: int, micro: int, world: int) -> int:
    """The largest micro batch up to the recipe's that divides each rank's share of the global batch, so
    a recipe works unchanged on 2 CPU processes or 8 GPUs."""
    per_rank = global_batch // world
    micro = min(micro, max(per_rank, 1))
    while micro > 1 and per_rank % micro:
        micro -= 1
    return micro


def _shown(value) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def continue_run(previous: Job, job: Job, step: int | None) -> str | None:
    """`job` launched into the folder of an existing run (`previous`, its spec.json), whose last checkpoint is at
    `step` (0: none yet; None: the workload keeps its own). What it trains must be the run's: a field that changes
    the training is refused, named. Where it runs may change (nodes, processes, instance type: the global batch, not
    the world size, says what is trained, and the checkpoints reshard), and a global batch or learning rate the
    launcher chose for this world size gives way to the run's own. Returns the note that says so, if any."""
    o, before = job.optimisation, previous.optimisation
    chosen = {
        "global_batch_size": o.global_batch_derived and before.global_batch_derived,
        "lr": o.lr_derived and before.lr_derived,
    }
    changed = [
        f"{spec.flag} (the run's: {_shown(spec.get(previous))})"
        for spec in all_fields()
        if spec.trains and not chosen.get(spec.name) and spec.get(previous) != spec.get(job)
    ]
    if changed:
        raise SpecError(
            f"run {job.run.run_id!r} already exists with different {', '.join(changed)}, which changes what it "
            "trains; give the run's values to continue it, or pass a new --run-id (or drop --run-id to get one "
            "derived from the settings)"
        )
    kept = [
        f"{what} {getattr(before, name):g}"
        for name, what in (("global_batch_size", "global batch"), ("lr", "learning rate"))
        if chosen[name] and getattr(before, name) != getattr(o, name)
    ]
    if kept:
        o.global_batch_size, o.lr = before.global_batch_size, before.lr
        # the micro batch fitted for this launch's batch: refitted to the run's (no more than either launch took)
        o.micro_batch_size = largest_share_micro_batch(job, max(o.micro_batch_size or 1, before.micro_batch_size or 1))
        job.run.notes[:] = [note for note in job.run.notes if not note.startswith(ROUNDING_NOTES)]  # not so now
        validate_batch(job)  # the run's batch, split over this world size
    if (previous.parallelism.nodes, previous.parallelism.nproc) == (job.parallelism.nodes, job.parallelism.nproc):
        return None
    then, now = f"{_size(previous, adjective=True)} run", _size(job)
    if step is None:
        note = f"continuing a {then} on {now}"
    elif step:
        note = f"resuming step {step} of a {then} on {now}"
    else:
        note = f"starting a {then} again on {now} (it has no checkpoint yet)"
    return note + (f"; its {' and '.join(kept)} stay the run's" if kept else "")


def _size(job: Job, adjective: bool = False) -> str:
    """A run's size in words: `2 processes`, `2 nodes (16 processes)`; as an adjective `2-process`, `2-node`."""
    p = job.parallelism
    if adjective:
        return f"{p.nproc}-process" if p.nodes == 1 else f"{p.nodes}-node ({job.world_size}-process)"
    processes = f"{job.world_size} process{'es' * (job.world_size != 1)}"
    return processes if p.nodes == 1 else f"{p.nodes} nodes ({processes})"
