"""Check a complete job. It changes nothing and probes nothing but the local paths the job names (the
runs folder, a dataset path); the first problem found is raised as a SpecError naming the flag to change
and the values it allows."""

from __future__ import annotations

import os
import re
from pathlib import Path

from training.families import family_of, launcher_hook, text_families
from training.spec import SHARDING_STRATEGIES, ZERO_1, Job, all_fields, by_key, micro_steps
from trainkit.errors import SpecError
from trainkit.job.build import Machine, check_fields, compiler_missing
from trainkit.job.held_out import validate_eval_data_here, validate_evaluation, validate_keeping
from trainkit.job.lora import validate_lora
from trainkit.job.models import HUB_ID, ModelEntry, get_model, validate_weights_here
from trainkit.job.tracking import validate_tracking

DATA_PARALLEL_SAID = {ZERO_1: f"{ZERO_1} (DeepSpeed ZeRO stage 1)", "NO_SHARD": "NO_SHARD (DDP)"}


def family_kind(families: tuple[str, ...]) -> str:
    """How a refusal names the models a field is for: "language" for every text family."""
    if set(families) == set(text_families()):
        return "language"
    return " and ".join(family_of(family).kind for family in families)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise SpecError(message)


def validate(job: Job, machine: Machine) -> None:
    """The target-free rules. A recipe's model, data, batch and sharding are checked for a recipe only: a script
    or the sweep runs on the job's nodes and processes and reads none of them."""
    recipe = job.run.workload == "recipe"
    entry = get_model(job.model.name)
    if recipe:
        check_family(job, entry)
    check_fields(job)  # again: the recipe and the backend filled values in since the flags were checked
    o, p = job.optimisation, job.parallelism
    if recipe:
        require(o.steps is None or o.epochs is None, "give either --steps or --epochs, not both")
        require(
            o.warmup_steps is None or o.warmup_epochs is None,
            "give either --warmup-steps or --warmup-epochs, not both",
        )
    require(p.min_nodes <= p.nodes, f"--nodes {p.min_nodes}:{p.nodes}: the minimum must not exceed the maximum")
    if recipe:
        text = family_of(entry.family).text
        validate_evaluation(job, text)
        validate_keeping(job)
        if text:
            check_language_model(job, entry)
            _validate_fast_paths(job, machine)
        else:
            _validate_images(job, machine)
        _validate_model(job, entry)
        validate_lora(job, entry)
    require(
        job.elastic.rdzv != "etcd" or bool(job.elastic.rdzv_endpoint),
        "--rdzv etcd needs an etcd server: run `make up` (starts one on this machine) or give "
        "--rdzv-endpoint host:port (or use --rdzv c10d)",
    )
    # The sweep over gloo on CPU cores measures the collective path, not speed: more processes than cores is fine.
    cpu_sweep = job.run.workload == "nccl-test" and machine.gpus_per_node == 0
    if machine.process_limit is not None and not cpu_sweep:
        per_machine = machine.processes(p.nproc, p.nodes)
        require(
            per_machine <= machine.process_limit,
            f"--nproc {p.nproc} x --nodes {p.nodes} needs {per_machine} processes but this "
            f"machine has {machine.described}; use --nproc <= {machine.process_limit // p.nodes or 1}",
        )
    if recipe:
        validate_batch(job)
    _validate_metrics_ports(job)
    if recipe:
        _validate_sharding(job, machine)
    run_id = job.run.run_id
    require(
        RUN_ID.fullmatch(run_id) is not None,
        f"--run-id {run_id!r}: use 1-63 ASCII letters, digits, '-', '_' or '.', starting with a letter or digit "
        "(it names a folder, a Kubernetes job and label values)",
    )
    _validate_names(job)
    _validate_deadline(job)
    validate_tracking(job)
    if job.placement.target == "local":
        _validate_local(job)


def _validate_sharding(job: Job, machine: Machine) -> None:
    p = job.parallelism
    require(
        not (p.sharding == "HYBRID_SHARD" and (p.nodes < 2 or p.nproc < 2)),
        "--sharding HYBRID_SHARD shards within a node and replicates across nodes, so it needs --nodes >= 2 "
        f"and --nproc >= 2 (got {p.nodes} node(s) x {p.nproc}); on one node use FULL_SHARD or SHARD_GRAD_OP",
    )
    require(
        not (p.sharding == "HYBRID_SHARD" and machine.gpus_per_node == 0),
        "--sharding HYBRID_SHARD needs GPUs: Accelerate builds its 2-D device mesh only for FSDP on accelerators "
        "and refuses it on CPU processes; use FULL_SHARD here (HYBRID_SHARD runs on EKS)",
    )


def _validate_names(job: Job) -> None:
    """Values that are names or addresses, whatever the target."""
    endpoint = job.elastic.rdzv_endpoint
    if endpoint is not None:
        host, _, port = endpoint.rpartition(":")
        require(
            bool(host) and port.isdigit() and 0 < int(port) < 65536,
            f"--rdzv-endpoint {endpoint}: give host:port (port 1..65535), e.g. 127.0.0.1:2379",
        )
    split = job.data.dataset_split
    require(
        SPLIT.fullmatch(split or "") is not None,
        f"--dataset-split {split!r}: give a split name such as train or train[:10%]",
    )
    token_file = job.placement.hf_token_file
    if token_file is not None:
        path = Path(token_file).expanduser()
        require(path.is_file(), f"--hf-token-file {token_file} does not exist; write your token there or drop the flag")


# A run id names runs/<id>/, the PyTorchJob (after lower-casing) and label values (at most 63 characters).
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
SYSTEM_TREES = ("/proc", "/sys", "/dev")
SPLIT = re.compile(r"[A-Za-z0-9_.+%:\[\]-]+")  # datasets' split syntax: train, train[:10%], train+validation
EKS_ONLY = ("instance_type", "image", "namespace")
MAX_PORT = 65535


def _validate_deadline(job: Job) -> None:
    """--spot and --max-wait on SageMaker only, the wait covering the run. --max-runtime is every target's deadline
    (docs/checkpoints.md "Deadlines"); Batch's own minimum is its backend's check."""
    placement = job.placement
    for key in ("spot", "max_wait"):
        value = by_key()[key].get(job)
        require(
            value in (None, False) or placement.target == "sagemaker",
            f"{by_key()[key].flag} is for --target sagemaker (managed spot training); drop it",
        )
    require(placement.max_wait is None or bool(placement.spot), "--max-wait bounds a spot job's wait: add --spot")
    if placement.max_wait is not None and placement.max_runtime is not None:
        require(
            placement.max_wait >= placement.max_runtime,
            f"--max-wait {placement.max_wait} s is shorter than --max-runtime {placement.max_runtime} s; the wait "
            "includes the run, so give at least the runtime",
        )


def _validate_local(job: Job) -> None:
    """What only a run on this machine can get wrong: flags of the EKS target, the runs folder, a dataset."""
    for key in EKS_ONLY:
        field = by_key()[key]
        value = field.get(job)
        target = "eks" if key == "namespace" else "eks, sagemaker or batch"
        require(value is None, f"{field.flag} {value} is for --target {target}; drop it (or add --target)")
    runs = Path(job.run.runs_dir).expanduser().absolute()
    require(
        not any(runs == Path(tree) or runs.is_relative_to(tree) for tree in SYSTEM_TREES),
        f"--runs-dir {job.run.runs_dir} is inside a system folder ({', '.join(SYSTEM_TREES)}); choose one of yours",
    )
    existing = next(p for p in [runs, *runs.parents] if p.exists())
    require(existing.is_dir(), f"--runs-dir {job.run.runs_dir}: {existing} is a file, not a folder; choose a folder")
    require(
        os.access(existing, os.W_OK | os.X_OK),
        f"--runs-dir {job.run.runs_dir}: {existing} is not writable by you; choose a folder you can write",
    )
    validate_eval_data_here(job)
    validate_weights_here(job)
    data = job.data.dataset
    if job.run.workload != "recipe" or data == "synthetic" or Path(data).expanduser().exists():
        return
    family = family_of(job.model.family)
    flag = family.data_flag
    if not family.text:  # a family of its own kind of data: its launcher side says what it reads and how to make it
        check = launcher_hook(family, "check_inputs")
        if check:
            check(job, get_model(job.model.name))
        raise SpecError(f"{flag} {data}: no such file or folder; give {family.data_files}, or synthetic")
    require(
        HUB_ID.fullmatch(data) is not None,
        f"{flag} {data}: no such file or folder, and not a Hugging Face dataset id (owner/name); "
        "give a .jsonl file, a dataset folder, an owner/name id, or synthetic",
    )


def check_family(job: Job, entry: ModelEntry) -> None:
    """A flag of the other workload is a mistake worth stopping for, not something to ignore silently.
    The recipes fill only their own family's fields, so any other family's value was given."""
    for spec in all_fields():
        families = spec.families
        if families and entry.family not in families and spec.get(job) is not None:
            kind = family_kind(families)
            raise SpecError(f"{spec.flag} applies to {kind} models, not to {job.model.name}; drop it")
    sharding, family = job.parallelism.sharding, family_of(entry.family)
    if not family.fsdp2:
        said = " or ".join(DATA_PARALLEL_SAID[name] for name in family.shardings)
        require(
            sharding in family.shardings,
            f"--sharding {sharding}: {job.model.name} trains data-parallel: {said}; choose one of them or drop "
            "--sharding",
        )
    else:
        require(
            sharding != ZERO_1,
            f"--sharding {ZERO_1}: DeepSpeed ZeRO-1 is BERT's; {job.model.name} shards with FSDP2 "
            f"({', '.join(SHARDING_STRATEGIES)})",
        )
    if family.random_init_only:
        require(
            job.model.init == "random",
            f"--init {job.model.init}: {job.model.name} trains from random weights; use --init random",
        )
    optimizer = job.optimisation.optimizer
    allowed = family.optimizers
    if optimizer is not None and allowed:
        require(
            optimizer in allowed,
            f"--optimizer {optimizer}: {job.model.name} trains with {' or '.join(allowed)}; choose one of them",
        )


def _require_compiler(machine: Machine) -> None:
    missing = compiler_missing(machine)
    require(
        not missing,
        f"--compile true: {missing}; install one (Debian/Ubuntu: apt-get install "
        f"{'gcc' if machine.gpus_per_node else 'g++'} python3-dev) or drop --compile",
    )


def _validate_fast_paths(job: Job, machine: Machine) -> None:
    """A fast-path flag the job would ignore is refused, not dropped silently (training/llm/fast_paths.py)."""
    p = job.parallelism
    fsdp_only = [
        flag
        for flag, value in zip(
            ("--prefetch", "--reshard-last-layer", "--reduce-dtype"),
            (p.prefetch, p.reshard_last_layer, p.reduce_dtype),
            strict=True,
        )
        if value is not None
    ]
    require(
        p.sharding != "NO_SHARD" or not fsdp_only,
        f"{', '.join(fsdp_only)}: FSDP2 settings, and --sharding NO_SHARD is DDP (it all-reduces fp32 gradients and "
        "gathers nothing); drop them or choose an FSDP strategy",
    )
    fp32 = p.precision == "fp32" or (p.precision == "auto" and machine.gpus_per_node == 0)
    require(
        p.reduce_dtype != "bf16" or not fp32,
        f"--reduce-dtype {p.reduce_dtype}: under --precision {p.precision} "
        f"{'on this machine (no GPU) ' if p.precision == 'auto' else ''}gradients are fp32 and reduced in fp32; it "
        "applies with --precision bf16 (or auto on a GPU)",
    )
    require(
        p.reshard_last_layer is None or p.sharding != "SHARD_GRAD_OP",
        f"--reshard-last-layer {str(p.reshard_last_layer).lower()}: under --sharding SHARD_GRAD_OP no layer reshards "
        "after forward; it applies with FULL_SHARD or HYBRID_SHARD",
    )
    if p.compile and job.placement.target == "local":  # the training image carries its own (containers/train)
        _require_compiler(machine)
    require(
        p.ac_every is None or bool(p.activation_checkpointing),
        f"--ac-every {p.ac_every}: selects the layers activation checkpointing recomputes; add "
        "--activation-checkpointing true (or drop it)",
    )
    require(
        p.attention != "flash" or job.data.packing == "concat",
        "--attention flash: FlashAttention in scaled_dot_product_attention takes no mask, and --packing masked (the "
        "default) keeps each packed example to itself with one; give --packing concat, or drop --attention flash",
    )


def _validate_images(job: Job, machine: Machine) -> None:
    data = job.data
    given = {
        "--pin-memory": data.pin_memory,
        "--persistent-workers": data.persistent_workers,
        "--prefetch-factor": data.prefetch_factor,
    }
    loader_flags = [flag for flag, value in given.items() if value is not None]
    require(
        not (data.synthetic and loader_flags),
        f"{', '.join(loader_flags)}: data loader settings, and --synthetic makes its batches on the device with no "
        "loader; drop them (or drop --synthetic)",
    )
    worker_flags = [flag for flag in loader_flags if flag != "--pin-memory"]
    require(
        not (worker_flags and data.loader_workers == 0),
        f"{', '.join(worker_flags)}: settings of loader worker processes, and --loader-workers 0 loads in the "
        "training process; give --loader-workers 1 or more (or drop them)",
    )
    require(
        not (data.pin_memory and machine.gpus_per_node == 0),
        f"--pin-memory true pins host memory for copies to a GPU, and this machine has {machine.described}; "
        "drop it (it is on by default where there are GPUs)",
    )
    require(
        not (data.synthetic and job.optimisation.epochs is not None),
        "--synthetic has no dataset to count epochs over; use --steps",
    )
    require(
        not (data.synthetic and data.dataset != "synthetic"),
        f"--synthetic feeds random tensors; drop --data {data.dataset} (or drop --synthetic to read it)",
    )


def check_language_model(job: Job, entry: ModelEntry) -> None:
    """What a language model's shape allows, for `invoke train` and `invoke plan` alike: a sequence within its
    context, no more layers than it has (with the recipe's sequence length filled in)."""
    family = family_of(entry.family)
    generated = family.synthetic_format
    require(
        job.data.dataset != "synthetic" or job.data.data_format in (None, generated),
        f"--data-format {job.data.data_format}: --dataset synthetic generates {generated} records for "
        f"{job.model.name}; drop --data-format, or give a --dataset of {job.data.data_format} records",
    )
    context = entry.arch.max_position_embeddings
    require(
        job.data.seq_len <= context,
        f"--seq-len {job.data.seq_len} exceeds {job.model.name}'s context of {context} tokens; "
        f"use --seq-len <= {context}",
    )
    shortest, why = family.min_seq_len
    require(
        job.data.seq_len >= shortest,
        f"--seq-len {job.data.seq_len}: {why.format(model=job.model.name)}; use {shortest} or more",
    )
    model = job.model
    if model.layers is not None:
        full = entry.arch.num_hidden_layers
        require(model.layers <= full, f"--layers {model.layers} exceeds {model.name}'s {full} layers; use 1..{full}")


def _validate_model(job: Job, entry: ModelEntry) -> None:
    model = job.model
    if model.init == "pretrained":
        require(
            model.weights is not None,
            f"--model {model.name} has no published weights; use --init random or --weights <local HF directory>",
        )
        require(
            model.layers is None, "--layers truncates a randomly initialised model; drop --layers or use --init random"
        )
    else:
        require(model.weights is None, "--weights is only used with --init pretrained")


def _validate_metrics_ports(job: Job) -> None:
    """Rank r serves metrics on --metrics-port + r: every rank on one machine needs a port of its own (local: all
    nodes share this machine; EKS: a node's --nproc ranks share its pod)."""
    port, p = job.run.metrics_port, job.parallelism
    if not port:
        return
    ranks, where = (p.nproc, "each node") if job.placement.target == "eks" else (p.nproc * p.nodes, "this machine")
    last = port + ranks - 1
    require(
        last <= MAX_PORT,
        f"--metrics-port {port}: rank r serves port {port} + r, and the {ranks} ranks on {where} would need ports up "
        f"to {last}, past {MAX_PORT}; use --metrics-port <= {MAX_PORT - ranks + 1} (or 0 to serve no metrics)",
    )


def validate_batch(job: Job) -> None:
    """Every world size the job can run at (elastic: min..max nodes) must split the global batch: evenly for
    a batch the user gave; for one the launcher chose from the recipe (derive.choose_global_batch), into
    shares one apart, with no vision rank short of an image for one of its micro batches."""
    o, p = job.optimisation, job.parallelism
    for nodes in range(p.nodes, p.min_nodes - 1, -1):
        world = nodes * p.nproc
        per_step = o.micro_batch_size * world
        at = "" if nodes == p.nodes else f" (at {nodes} node(s), allowed by --nodes {p.min_nodes}:{p.nodes})"
        if o.global_batch_derived:
            short = o.global_batch_size // world < (micro_steps(o.global_batch_size, o.micro_batch_size, world))
            require(
                o.global_batch_size >= world and not (short and family_of(job.model.family).full_micro_batches),
                f"the recipe's global batch {o.global_batch_size} cannot be split over {world} processes{at}; "
                f"give --global-batch-size as a multiple of {per_step}",
            )
            continue
        require(
            o.global_batch_size % per_step == 0,
            f"--global-batch-size {o.global_batch_size} is not divisible by --micro-batch-size "
            f"{o.micro_batch_size} x {world} processes = {per_step}{at}; use a multiple of {per_step}",
        )
