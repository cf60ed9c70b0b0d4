"""The job spec: one typed, validated object built from a profile YAML and CLI flags.

Order of precedence (last wins): dataclass defaults < model recipe < profile YAML < flags.
Every check runs before anything is created, started or paid for, and names the flag to change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from . import hardware
from .errors import SpecError
from .models import get_model

SHARDING_STRATEGIES = ("FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP", "NO_SHARD")
INITS = ("random", "pretrained")
PRECISIONS = ("auto", "bf16", "fp32")
SCHEDULES = ("cosine", "constant")
RDZV_BACKENDS = ("c10d", "etcd")
TARGETS = ("local",)
PROFILES_DIR = Path(__file__).parent / "profiles"

# Fields that do not change what is trained: a run may be resumed with other values for them.
_RESUMABLE_FIELDS = frozenset(
    {
        "run_id",
        "runs_dir",
        "log_interval",
        "metrics_port",
        "keep_checkpoints",
        "rdzv",
        "rdzv_endpoint",
        "target",
        "profile",
        "notes",
        "hf_token_file",
    }
)


@dataclass
class JobSpec:
    """Everything a training job needs, whatever runs it."""

    model: str = "llama2-tiny"
    """Registry name (see `trainkit.models.REGISTRY`)."""
    init: str = "random"
    """`random`: build from config, no download. `pretrained`: load weights from `weights`."""
    weights: str | None = None
    """Pretrained weights: a Hugging Face hub id or a local directory; defaults to the model's hub id."""
    layers: int | None = None
    """Truncate the model to this many layers (benchmarks and tests; labelled in every output)."""
    dataset: str = "synthetic"
    """`synthetic` (generated dialogue data), a local `.jsonl` file, or a Hugging Face dataset name."""
    dataset_split: str = "train"
    """Split to read from a Hugging Face dataset."""
    steps: int | None = None
    """Optimizer steps to train; default from the model recipe unless `epochs` is given."""
    epochs: int | None = None
    """Passes over the packed dataset; alternative to `steps`."""
    global_batch_size: int | None = None
    """Sequences per optimizer step, all ranks together."""
    micro_batch_size: int | None = None
    """Sequences per forward pass on one rank."""
    seq_len: int | None = None
    """Tokens per packed sequence; at most the model's context length."""
    lr: float | None = None
    """Peak learning rate."""
    schedule: str = "cosine"
    """Learning-rate schedule after linear warmup: `cosine` (to 10% of peak) or `constant`."""
    warmup_steps: int | None = None
    """Linear warmup steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    sharding: str = "FULL_SHARD"
    """FSDP strategy: FULL_SHARD, HYBRID_SHARD (shard in a node, replicate across), SHARD_GRAD_OP, NO_SHARD."""
    precision: str = "auto"
    """`auto` (bf16 on GPUs that support it, fp32 on CPU), `bf16` or `fp32`."""
    activation_checkpointing: bool | None = None
    """Recompute each decoder layer's activations in backward; default from the model recipe."""
    checkpoint_interval: int | None = None
    """Save a sharded checkpoint every N steps (0: only at the end)."""
    keep_checkpoints: int = 2
    """How many published checkpoints to keep."""
    log_interval: int = 1
    """Log metrics every N steps."""
    nodes: int = 1
    """Nodes (machines) in the job."""
    nproc: int | None = None
    """Processes per node; default: all local GPUs, or 2 on a CPU-only machine."""
    rdzv: str = "c10d"
    """Rendezvous backend: `c10d` or `etcd`."""
    rdzv_endpoint: str | None = None
    """host:port of the rendezvous store; local default: a free port on 127.0.0.1."""
    target: str = "local"
    """Where the job runs."""
    seed: int = 1234
    """Seed for weights, data order and dropout."""
    peak_tflops: float | None = None
    """Peak TFLOP/s per device for MFU; default from the device table (no MFU on CPU without it)."""
    metrics_port: int = 9400
    """Prometheus port of rank 0 (rank r serves on port + r); 0 disables."""
    run_id: str | None = None
    """Run directory name under `runs_dir`; default: model plus a hash of what is trained."""
    runs_dir: str = "runs"
    """Where runs live."""
    profile: str = "local"
    """Profile YAML the defaults came from."""
    hf_token_file: str | None = None
    """File holding a Hugging Face token (the token itself is never part of the spec)."""
    truncated_label: str | None = field(default=None)
    """Set by validation when `layers` truncates the model, so every output says so."""
    notes: list[str] = field(default_factory=list)
    """Adjustments the launcher made to the defaults, shown to the user and kept in spec.json."""

    # ------------------------------------------------------------------ derived values

    @property
    def world_size(self) -> int:
        return self.nodes * int(self.nproc or 1)

    @property
    def grad_accum_steps(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.world_size)

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / str(self.run_id)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["world_size"] = self.world_size
        data["grad_accum_steps"] = self.grad_accum_steps
        return data

    def training_fingerprint(self) -> str:
        """Hash of the fields that change what is trained (not where logs go or how it is launched)."""
        relevant = {k: v for k, v in dataclasses.asdict(self).items() if k not in _RESUMABLE_FIELDS}
        blob = json.dumps(relevant, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:8]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def load_profile(profile: str) -> dict[str, Any]:
    path = PROFILES_DIR / f"{profile}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))
        raise SpecError(f"--profile {profile!r} does not exist; choose one of: {', '.join(known)}")
    data = yaml.safe_load(path.read_text()) or {}
    unknown = set(data) - {f.name for f in fields(JobSpec)}
    if unknown:
        raise SpecError(f"profile {path} has unknown keys {sorted(unknown)}; remove them")
    return data


_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def parse_bool(flag: str, value: str) -> bool:
    """true/false (also yes/no, 1/0, on/off) from the command line, or a SpecError naming the flag."""
    text = value.strip().lower()
    if text in _TRUE + _FALSE:
        return text in _TRUE
    raise SpecError(f"{flag} must be true or false (got {value!r})")


def _coerce(name: str, value: Any) -> Any:
    """Flags arrive as text from the command line; turn them into the field's type."""
    hint = typing.get_type_hints(JobSpec)[name]
    if isinstance(hint, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if not isinstance(value, str) or hint is str:
        return value
    if hint is bool:
        return parse_bool(_flag(name), value)
    try:
        return hint(value)
    except ValueError:
        kind = "an integer" if hint is int else "a number"
        raise SpecError(f"{_flag(name)} must be {kind} (got {value!r})") from None


def build_spec(overrides: dict[str, Any], profile: str = "local") -> JobSpec:
    """Merge recipe, profile and flags (None means 'not given'), then validate."""
    given = {k: v for k, v in overrides.items() if v is not None}
    known = {f.name for f in fields(JobSpec)}
    unknown = set(given) - known
    if unknown:
        raise SpecError(f"unknown option(s): {', '.join(_flag(u) for u in sorted(unknown))}")
    given = {k: _coerce(k, v) for k, v in given.items()}
    merged: dict[str, Any] = dict(load_profile(profile))
    merged.update(given)
    merged["profile"] = profile
    spec = JobSpec(**merged)
    entry = get_model(spec.model)
    recipe = dataclasses.asdict(entry.recipe)
    cpu_batch = recipe.pop("cpu_batch")
    batch_given = spec.global_batch_size is not None or spec.micro_batch_size is not None
    if cpu_batch and not batch_given and spec.target == "local" and hardware.local_gpu_count() == 0:
        spec.global_batch_size, spec.micro_batch_size = cpu_batch
        spec.notes.append(
            f"no GPU: using the CPU batch of the {spec.model} recipe (global {cpu_batch[0]}, micro "
            f"{cpu_batch[1]}); set --global-batch-size / --micro-batch-size to change it"
        )
    for name, value in recipe.items():
        if name == "steps" and spec.epochs is not None:
            continue
        if getattr(spec, name) is None:
            setattr(spec, name, value)
    validate(spec, micro_batch_given="micro_batch_size" in merged)
    return spec


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise SpecError(message)


def _positive_int(spec: JobSpec, name: str, allow_zero: bool = False) -> None:
    value = getattr(spec, name)
    ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
    kind = "a non-negative" if allow_zero else "a positive"
    _require(ok, f"{_flag(name)} must be {kind} integer (got {value!r})")


def _choice(spec: JobSpec, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(spec, name)
    _require(value in allowed, f"{_flag(name)} {value!r} is not valid; choose one of: {', '.join(allowed)}")


def machine_process_limit() -> tuple[int, str]:
    """How many training processes this machine can host: one per GPU, else one per CPU core."""
    gpus = hardware.local_gpu_count()
    if gpus:
        return gpus, f"{gpus} GPU(s)"
    cpus = hardware.local_cpu_count()
    return cpus, f"{cpus} CPU core(s) and no GPU"


def validate(spec: JobSpec, micro_batch_given: bool = True) -> None:
    """Raise SpecError naming the flag and the allowed values for the first problem found.

    When the micro batch comes from the model recipe it shrinks to fit the number of processes,
    so a recipe works unchanged on 2 CPU processes or 8 GPUs.
    """
    entry = get_model(spec.model)
    _choice(spec, "init", INITS)
    _choice(spec, "sharding", SHARDING_STRATEGIES)
    _choice(spec, "precision", PRECISIONS)
    _choice(spec, "schedule", SCHEDULES)
    _choice(spec, "rdzv", RDZV_BACKENDS)
    _choice(spec, "target", TARGETS)
    _require(
        spec.steps is None or spec.epochs is None,
        "give either --steps or --epochs, not both",
    )
    if spec.epochs is not None:
        _positive_int(spec, "epochs")
    else:
        _positive_int(spec, "steps")
    for name in ("global_batch_size", "micro_batch_size", "seq_len", "nodes", "log_interval", "keep_checkpoints"):
        _positive_int(spec, name)
    for name in ("warmup_steps", "checkpoint_interval", "metrics_port", "seed"):
        _positive_int(spec, name, allow_zero=True)
    _require(spec.lr > 0, f"--lr must be positive (got {spec.lr})")
    _require(spec.weight_decay >= 0, f"--weight-decay must be >= 0 (got {spec.weight_decay})")
    _require(spec.grad_clip >= 0, f"--grad-clip must be >= 0 (got {spec.grad_clip}; 0 disables clipping)")
    _require(
        spec.peak_tflops is None or spec.peak_tflops > 0,
        f"--peak-tflops must be positive (got {spec.peak_tflops})",
    )
    context = entry.arch.max_position_embeddings
    _require(
        spec.seq_len <= context,
        f"--seq-len {spec.seq_len} exceeds {spec.model}'s context of {context} tokens; use --seq-len <= {context}",
    )
    if spec.layers is not None:
        _positive_int(spec, "layers")
        full = entry.arch.num_hidden_layers
        _require(spec.layers <= full, f"--layers {spec.layers} exceeds {spec.model}'s {full} layers; use 1..{full}")
        spec.truncated_label = f"{spec.model} truncated to {spec.layers} of {full} layers"

    if spec.init == "pretrained":
        if spec.weights is None:
            _require(
                entry.hub_id is not None,
                f"--model {spec.model} has no published weights; use --init random or --weights <local HF directory>",
            )
            spec.weights = entry.hub_id
        _require(
            spec.layers is None,
            "--layers truncates a randomly initialised model; drop --layers or use --init random",
        )
    else:
        _require(spec.weights is None, "--weights is only used with --init pretrained")

    _require(
        spec.rdzv != "etcd" or bool(spec.rdzv_endpoint),
        "--rdzv etcd needs --rdzv-endpoint host:port of a running etcd server (or use --rdzv c10d)",
    )
    _require(
        spec.target != "local" or spec.nodes == 1,
        f"--nodes {spec.nodes}: the local target runs one node; use --nodes 1",
    )
    _validate_processes(spec)
    if not micro_batch_given:
        _fit_micro_batch(spec)
    _validate_batch(spec)
    _require(
        not (spec.sharding == "HYBRID_SHARD" and (spec.nodes < 2 or spec.nproc < 2)),
        "--sharding HYBRID_SHARD shards within a node and replicates across nodes, so it needs --nodes >= 2 "
        f"and --nproc >= 2 (got {spec.nodes} node(s) x {spec.nproc}); "
        "on one node use FULL_SHARD or SHARD_GRAD_OP",
    )
    if spec.run_id is None:
        spec.run_id = f"{spec.model}-{spec.training_fingerprint()}"
    _require(
        all(c.isalnum() or c in "-_." for c in spec.run_id) and not spec.run_id.startswith("."),
        f"--run-id {spec.run_id!r} may only contain letters, digits, '-', '_' and '.'",
    )


def _validate_processes(spec: JobSpec) -> None:
    limit, what = machine_process_limit()
    if spec.nproc is None:
        spec.nproc = limit if hardware.local_gpu_count() else min(2, limit)
    _positive_int(spec, "nproc")
    if spec.target == "local":
        per_machine = spec.nproc * spec.nodes
        _require(
            per_machine <= limit,
            f"--nproc {spec.nproc} x --nodes {spec.nodes} needs {per_machine} processes but this "
            f"machine has {what}; use --nproc <= {limit // spec.nodes or 1}",
        )


def _fit_micro_batch(spec: JobSpec) -> None:
    per_rank = spec.global_batch_size // spec.world_size
    micro = min(spec.micro_batch_size, max(per_rank, 1))
    while micro > 1 and per_rank % micro:
        micro -= 1
    spec.micro_batch_size = micro


def _validate_batch(spec: JobSpec) -> None:
    per_step = spec.micro_batch_size * spec.world_size
    _require(
        spec.global_batch_size % per_step == 0,
        f"--global-batch-size {spec.global_batch_size} is not divisible by --micro-batch-size "
        f"{spec.micro_batch_size} x {spec.world_size} processes = {per_step}; use a multiple of {per_step}",
    )


def write_spec(spec: JobSpec) -> Path:
    """Write `runs/<run-id>/spec.json`, refusing to mix two different jobs in one run directory."""
    path = spec.run_dir / "spec.json"
    if path.exists():
        previous = json.loads(path.read_text())
        current = spec.to_dict()
        changed = sorted(
            k for k in current if k not in _RESUMABLE_FIELDS and k in previous and previous[k] != current[k]
        )
        if changed:
            raise SpecError(
                f"run {spec.run_id!r} already exists with different {', '.join(changed)}; "
                "pass a new --run-id (or drop --run-id to get one derived from the settings)"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(spec.to_dict(), indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path
