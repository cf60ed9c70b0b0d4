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

from training.common.files import publish_text

from . import cluster, hardware
from .errors import SpecError
from .models import get_model

SHARDING_STRATEGIES = ("FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP", "NO_SHARD")
INITS = ("random", "pretrained")
PRECISIONS = ("auto", "bf16", "fp32")
SCHEDULES = ("cosine", "constant")
OPTIMIZERS = ("sgd", "lamb")
RDZV_BACKENDS = ("c10d", "etcd")
TARGETS = ("local", "eks")
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
        "min_nodes",
        "max_restarts",
        "collective_timeout",
        "instance_type",
        "image",
        "namespace",
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
    """`synthetic` (generated: dialogues for language models, a 10-class JPEG tree for vision), a local `.jsonl`
    file or ImageFolder root (train/<class>/, val/<class>/), or a Hugging Face dataset name. Alias: --data."""
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
    """Linear warmup steps (or --warmup-epochs)."""
    weight_decay: float | None = None
    """Weight decay (language models: AdamW, 0; vision: conv/linear weights, 1e-4); default from the recipe."""
    grad_clip: float | None = None
    """Clip the global gradient norm to this value (0 disables); recipe: 1.0 for language models, 0 for vision."""
    sharding: str | None = None
    """FSDP strategy: FULL_SHARD, HYBRID_SHARD (shard in a node, replicate across), SHARD_GRAD_OP, NO_SHARD (DDP).
    Language models default to FULL_SHARD; vision models always train NO_SHARD."""
    precision: str = "auto"
    """`auto` (bf16 on GPUs that support it, fp32 on CPU), `bf16` or `fp32`."""
    activation_checkpointing: bool | None = None
    """Recompute each decoder layer's activations in backward; default from the model recipe."""
    checkpoint_interval: int | None = None
    """Save a checkpoint every N steps (0: only at the end; vision also saves at every epoch end)."""
    image_size: int | None = None
    """Vision: training crop in pixels (validation resizes to size/0.875, centre-crops); default from the recipe."""
    optimizer: str | None = None
    """Vision: `sgd` (Nesterov momentum 0.9) or `lamb` (layer-wise adaptive, for large batches). LLMs use AdamW."""
    label_smoothing: float | None = None
    """Vision: label smoothing of the cross-entropy loss (recipe: 0.1)."""
    loader_workers: int | None = None
    """Vision: data loader worker processes per training process (recipe: 4; 1 on a CPU-only machine)."""
    synthetic: bool | None = None
    """Vision: random tensors made on the device instead of images, to measure the compute ceiling."""
    warmup_epochs: float | None = None
    """Linear warmup in epochs (vision recipe: 5); alternative to --warmup-steps."""
    keep_checkpoints: int = 2
    """How many published checkpoints to keep."""
    log_interval: int = 1
    """Log metrics every N steps."""
    nodes: int = 1
    """Nodes (machines) in the job; `MIN:MAX` (e.g. `1:2`) makes the job elastic between the two.
    On the local target each node is a torchrun agent on this machine."""
    min_nodes: int | None = None
    """Fewest nodes the job keeps training with (set by `--nodes MIN:MAX`); default: all of them."""
    max_restarts: int = 3
    """Times the agents restart the workers after a failure before the job fails."""
    collective_timeout: int = 600
    """Seconds a collective waits for a silent peer (a hung GPU, a partitioned node) before the rank
    fails and the agents restart the group, instead of the job hanging."""
    nproc: int | None = None
    """Processes per node; default: all local GPUs, or 2 on a CPU-only machine."""
    rdzv: str | None = None
    """Rendezvous backend: `c10d` (a store hosted by node 0) or `etcd` (a store outside the nodes, which
    survives the loss of any node). Default: c10d locally, etcd (the platform's) on EKS."""
    rdzv_endpoint: str | None = None
    """host:port of the rendezvous store; local default: a free port on 127.0.0.1 (c10d) or the etcd
    `make up` started; EKS: worker 0 (c10d) or the platform's etcd service."""
    target: str = "local"
    """Where the job runs: `local` (processes on this machine) or `eks` (a PyTorchJob on the cluster)."""
    instance_type: str | None = None
    """EKS: GPU instance type of the nodes, which sets --nproc; default: the infra stack's, else p5.48xlarge."""
    image: str | None = None
    """EKS: training image; default: the infra stack's ECR `train` repository at tag `latest`."""
    namespace: str | None = None
    """EKS: namespace of the job; default: trainkit-jobs (made by the platform stack)."""
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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        """The spec `to_dict` wrote (the derived values are dropped; they follow from the rest)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

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
    if isinstance(given.get("nodes"), str) and ":" in given["nodes"]:
        low, _, high = given["nodes"].partition(":")
        if not (low.isdigit() and high.isdigit()):
            raise SpecError(f"--nodes must be N or MIN:MAX, e.g. 1:2 (got {given['nodes']!r})")
        given["min_nodes"], given["nodes"] = low, high
    given = {k: _coerce(k, v) for k, v in given.items()}
    merged: dict[str, Any] = dict(load_profile(profile))
    merged.update(given)
    merged["profile"] = profile
    spec = JobSpec(**merged)
    entry = get_model(spec.model)
    _check_family(spec, entry.family, {k for k, v in merged.items() if v is not None})
    recipe = dataclasses.asdict(entry.recipe)
    cpu = recipe.pop("cpu")
    if cpu and spec.target == "local" and hardware.local_gpu_count() == 0:
        _apply_cpu_recipe(spec, cpu)
    if spec.synthetic:
        if spec.steps is None and spec.epochs is None:
            spec.steps = SYNTHETIC_STEPS
            spec.notes.append(f"--synthetic has no epochs: running {SYNTHETIC_STEPS} steps (set --steps to change it)")
        if spec.warmup_steps is None and spec.warmup_epochs is None:
            spec.warmup_steps = 0  # no epochs to warm up over
    given = {name for name in recipe if getattr(spec, name) is not None}
    for name, value in recipe.items():
        pair = _ALTERNATIVES.get(name)
        if value is None or name in given or (pair and pair in given):
            continue
        setattr(spec, name, value)
    if entry.family == "vision" and spec.lr is None:
        spec.lr = _scaled_lr(spec)
        spec.notes.append(
            f"learning rate {spec.lr:g} from the {spec.optimizer} scaling rule for a global batch of "
            f"{spec.global_batch_size} (set --lr to change it)"
        )
    validate(spec, micro_batch_given="micro_batch_size" in merged)
    return spec


SYNTHETIC_STEPS = 50
# Fields that are alternatives: giving one (flag or profile) drops the recipe's value for the other.
_ALTERNATIVES = {"steps": "epochs", "epochs": "steps", "warmup_steps": "warmup_epochs", "warmup_epochs": "warmup_steps"}
FAMILY_FIELDS = {
    "llama": ("seq_len", "layers", "activation_checkpointing", "weights"),
    "vision": ("image_size", "optimizer", "label_smoothing", "loader_workers", "synthetic", "warmup_epochs"),
}


def _check_family(spec: JobSpec, family: str, given: set[str]) -> None:
    """A flag of the other workload is a mistake worth stopping for, not something to ignore silently."""
    for other, names in FAMILY_FIELDS.items():
        if other == family:
            continue
        for name in names:
            if name in given:
                kind = "language" if other == "llama" else "vision"
                raise SpecError(f"{_flag(name)} applies to {kind} models, not to {spec.model}; drop it")
    if family == "vision":
        if spec.sharding not in (None, "NO_SHARD"):
            raise SpecError(
                f"--sharding {spec.sharding}: {spec.model} trains data-parallel (NO_SHARD, DDP); drop --sharding"
            )
        if spec.init != "random":
            raise SpecError(f"--init {spec.init}: {spec.model} trains from random weights; use --init random")


def _apply_cpu_recipe(spec: JobSpec, cpu: dict[str, Any]) -> None:
    """The recipe's CPU-sized values, for fields nobody set; the two batch sizes go together."""
    batch = ("global_batch_size", "micro_batch_size")
    skip = set(batch) if any(getattr(spec, name) is not None for name in batch) else set()
    applied = {k: v for k, v in cpu.items() if k not in skip and getattr(spec, k) is None}
    for name, value in applied.items():
        setattr(spec, name, value)
    if applied:
        settings = ", ".join(f"{_flag(k)} {v}" for k, v in applied.items())
        spec.notes.append(f"no GPU: using the CPU settings of the {spec.model} recipe ({settings}); set them to change")


def _scaled_lr(spec: JobSpec) -> float:
    """SGD: linear scaling, 0.1 per 256 images (Goyal et al. 2017). LAMB: square-root scaling from 0.005
    per 256 (You et al. 2019 scale LAMB's rate with the square root of the batch); an untuned start."""
    ratio = spec.global_batch_size / 256
    return 0.1 * ratio if spec.optimizer == "sgd" else 0.005 * ratio**0.5


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
    if spec.optimizer is not None:
        _choice(spec, "optimizer", OPTIMIZERS)
    _choice(spec, "target", TARGETS)
    if spec.rdzv is None:
        spec.rdzv = "etcd" if spec.target == "eks" else "c10d"
        if spec.target == "eks":
            spec.notes.append(
                "rendezvous: etcd (the platform's), which survives the loss of any node; "
                "--rdzv c10d uses a store on worker 0 instead (README, Elastic training)"
            )
    _choice(spec, "rdzv", RDZV_BACKENDS)
    _require(
        spec.steps is None or spec.epochs is None,
        "give either --steps or --epochs, not both",
    )
    if spec.epochs is not None:
        _positive_int(spec, "epochs")
    else:
        _positive_int(spec, "steps")
    _require(
        spec.warmup_steps is None or spec.warmup_epochs is None,
        "give either --warmup-steps or --warmup-epochs, not both",
    )
    for name in (
        "global_batch_size",
        "micro_batch_size",
        "nodes",
        "log_interval",
        "keep_checkpoints",
        "collective_timeout",
    ):
        _positive_int(spec, name)
    for name in ("checkpoint_interval", "metrics_port", "seed", "max_restarts"):
        _positive_int(spec, name, allow_zero=True)
    if spec.min_nodes is None:
        spec.min_nodes = spec.nodes
    _positive_int(spec, "min_nodes")
    _require(
        spec.min_nodes <= spec.nodes,
        f"--nodes {spec.min_nodes}:{spec.nodes}: the minimum must not exceed the maximum",
    )
    if spec.warmup_steps is not None:
        _positive_int(spec, "warmup_steps", allow_zero=True)
    if spec.warmup_epochs is not None:
        _require(spec.warmup_epochs >= 0, f"--warmup-epochs must be >= 0 (got {spec.warmup_epochs})")
    _require(spec.lr > 0, f"--lr must be positive (got {spec.lr})")
    _require(spec.weight_decay >= 0, f"--weight-decay must be >= 0 (got {spec.weight_decay})")
    _require(spec.grad_clip >= 0, f"--grad-clip must be >= 0 (got {spec.grad_clip}; 0 disables clipping)")
    _require(
        spec.peak_tflops is None or spec.peak_tflops > 0,
        f"--peak-tflops must be positive (got {spec.peak_tflops})",
    )
    if entry.family == "vision":
        _validate_vision(spec)
    else:
        _positive_int(spec, "seq_len")
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

    if spec.target == "eks":
        _validate_eks(spec)
    elif spec.rdzv == "etcd" and not spec.rdzv_endpoint:
        from .services import LocalEtcd

        spec.rdzv_endpoint = LocalEtcd().endpoint()  # the one `make up` started, if it runs
    _require(
        spec.rdzv != "etcd" or bool(spec.rdzv_endpoint),
        "--rdzv etcd needs an etcd server: run `make up` (starts one on this machine) or give "
        "--rdzv-endpoint host:port (or use --rdzv c10d)",
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
    _require(
        not (spec.sharding == "HYBRID_SHARD" and spec.target == "local" and hardware.local_gpu_count() == 0),
        "--sharding HYBRID_SHARD needs GPUs: Accelerate builds its 2-D device mesh only for FSDP on accelerators "
        "and refuses it on CPU processes; use FULL_SHARD here (HYBRID_SHARD runs on EKS)",
    )
    if spec.run_id is None:
        spec.run_id = f"{spec.model}-{spec.training_fingerprint()}"
    _require(
        all(c.isalnum() or c in "-_." for c in spec.run_id) and not spec.run_id.startswith("."),
        f"--run-id {spec.run_id!r} may only contain letters, digits, '-', '_' and '.'",
    )


def _validate_vision(spec: JobSpec) -> None:
    _positive_int(spec, "image_size")
    _positive_int(spec, "loader_workers", allow_zero=True)
    _require(
        0 <= spec.label_smoothing < 1,
        f"--label-smoothing must be in [0, 1) (got {spec.label_smoothing})",
    )
    _require(
        not (spec.synthetic and spec.epochs is not None),
        "--synthetic has no dataset to count epochs over; use --steps",
    )
    _require(
        not (spec.synthetic and spec.dataset != "synthetic"),
        f"--synthetic feeds random tensors; drop --data {spec.dataset} (or drop --synthetic to read it)",
    )


def _validate_eks(spec: JobSpec) -> None:
    """Defaults from the cluster's infra outputs; one process per GPU of the instance type."""
    outputs = cluster.load_outputs()
    if spec.instance_type is None:
        spec.instance_type = outputs.instance_type
        if not outputs.recorded:
            spec.notes.append(
                f"no infra outputs recorded yet (`make up PROFILE=aws` records them): assuming "
                f"{spec.instance_type} nodes; --instance-type sets it"
            )
    known = hardware.INSTANCE_TYPES
    _require(
        spec.instance_type in known,
        f"--instance-type {spec.instance_type!r} is not in the instance table; choose one of: {', '.join(known)}",
    )
    gpus = known[spec.instance_type].gpus
    if spec.nproc is None:
        spec.nproc = gpus
    _require(
        0 < spec.nproc <= gpus,
        f"--nproc {spec.nproc}: a {spec.instance_type} node has {gpus} GPUs; use --nproc 1..{gpus} (default: all)",
    )
    if spec.image is None:
        repository = outputs.image_repository
        spec.image = f"{repository}:{cluster.DEFAULT_IMAGE_TAG}" if repository else cluster.UNRECORDED_IMAGE
    if spec.namespace is None:
        spec.namespace = cluster.JOBS_NAMESPACE
    if spec.rdzv == "etcd" and not spec.rdzv_endpoint:
        spec.rdzv_endpoint = cluster.etcd_endpoint()
    runs = Path(spec.runs_dir)
    _require(
        not runs.is_absolute() or runs.is_relative_to(cluster.FSX_MOUNT),
        f"--runs-dir {spec.runs_dir}: on EKS runs live on the FSx volume; give a path relative to it "
        f"(default `runs`) or under {cluster.FSX_MOUNT}",
    )
    data = Path(spec.dataset)
    _require(
        not data.is_absolute() or data.is_relative_to(cluster.FSX_MOUNT),
        f"--dataset {spec.dataset}: training pods read data from the FSx volume; copy it there and give a path "
        f"under {cluster.FSX_MOUNT} (or relative to it), a Hugging Face dataset name, or 'synthetic'",
    )


def _validate_processes(spec: JobSpec) -> None:
    if spec.target == "eks":
        return  # one process per GPU of the instance type (_validate_eks)
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
    """Every world size the job can run at (elastic: min..max nodes) must split the global batch."""
    for nodes in range(spec.nodes, spec.min_nodes - 1, -1):
        world = nodes * spec.nproc
        per_step = spec.micro_batch_size * world
        at = "" if nodes == spec.nodes else f" (at {nodes} node(s), allowed by --nodes {spec.min_nodes}:{spec.nodes})"
        _require(
            spec.global_batch_size % per_step == 0,
            f"--global-batch-size {spec.global_batch_size} is not divisible by --micro-batch-size "
            f"{spec.micro_batch_size} x {world} processes = {per_step}{at}; use a multiple of {per_step}",
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
    return publish_text(path, json.dumps(spec.to_dict(), indent=2, sort_keys=True) + "\n")
