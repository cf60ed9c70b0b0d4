"""The job model: every option of a training job, declared once.

Each option is a field of one section (run, model, data, optimisation, parallelism, checkpointing,
elastic, placement) with its type, default, help text, allowed values and range in one place. The
launcher (trainkit) derives the `invoke train` flags and their help from these declarations, fills in
and checks the values, and writes the job as `runs/<run-id>/spec.json`; the training workers read
that file back into the same classes (`read_job`). Nothing here imports torch or trainkit, so the
training image and the launcher share it.

A field's flag is its name with '-' for '_' (`--keep-checkpoints`), except where `flag` says
otherwise (`model.name` is `--model`). `None` means "not given": the model recipe, the machine or
the backend decides, and spec.json records the value that was decided.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.families import FAMILIES, FORMER_NAMES, TEXT_FAMILIES, family_of

SPEC_FILE = "spec.json"
SUMMARY_FILE = "summary.json"
"""A finished run's summary (training/common/metrics.py publishes it last): the run finished."""
SPEC_VERSION = 2  # spec.json before it (one flat object) is read too: see from_dict

SHARDING_STRATEGIES = ("FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP", "NO_SHARD")
"""FSDP2's strategies (NO_SHARD: DDP)."""
ZERO_1 = "ZERO_1"
"""DeepSpeed ZeRO stage 1: parameters and gradients replicated, the optimizer state partitioned over the ranks."""
SHARDING_CHOICES = (*SHARDING_STRATEGIES, ZERO_1)
TARGETS = ("local", "eks", "sagemaker", "batch")
SYNTHETIC = "synthetic"


def option(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] = (),
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    flag: str | None = None,
    alias: str | None = None,
    trains: bool = True,
    family: str | tuple[str, ...] | None = None,
    cli: bool = True,
    switch: bool = False,
    duration: bool = False,
) -> Any:
    """One field of the job.

    choices   allowed values (text fields); minimum/maximum bound numbers inclusively, above/below
              exclusively; every number must also be finite
    flag      the command-line name when it is not the field's name; alias: a second name for it
    trains    whether the value changes what is trained (the run id hashes these; a run can be resumed
              with other values of the rest)
    family    the family (`decoder`, `vision`, `bert`), or families, whose models alone use the field
    cli       False for values the launcher sets itself (they are still in spec.json)
    switch    a boolean given as a bare flag (`--synthetic`) rather than with a value
    duration  seconds, also given as `90m`, `4h`, `2d` (see duration_seconds)
    """
    meta = {
        "help": help,
        "choices": choices,
        "minimum": minimum,
        "maximum": maximum,
        "above": above,
        "below": below,
        "flag": flag,
        "alias": alias,
        "trains": trains,
        "family": family,
        "cli": cli,
        "switch": switch,
        "duration": duration,
    }
    if isinstance(default, list | dict):
        return field(default_factory=type(default), metadata=meta)
    return field(default=default, metadata=meta)


def micro_steps(global_batch: int, micro_batch: int, world: int) -> int:
    """Forward/backward passes per optimizer step, the same on every rank: enough for the largest share."""
    largest_share = -(-global_batch // world)  # ceiling division
    return -(-largest_share // micro_batch)


def share(global_batch: int, world: int, rank: int) -> tuple[int, int]:
    """(offset, size) of rank's contiguous slice of a global batch: G // world each, the first G % world
    ranks one more. Even when the world divides G (the launcher insists on it unless it chose G itself
    for an elastic range, where no G divides every size)."""
    base, extra = divmod(global_batch, world)
    return rank * base + min(rank, extra), base + (rank < extra)


DATA_FORMATS = ("chat", "alpaca", "prompt-response", "dialogue-summary", "text")
"""The record formats language models read (training/text/formats.py says what each trains on)."""
PACKINGS = ("masked", "concat")
TRUNCATIONS = ("left", "drop")

WORKLOADS = ("recipe", "script", "nccl-test", "data")


@dataclass
class RunOptions:
    """Where the run lives and how it reports."""

    run_id: str | None = option(
        None, "Run directory name under --runs-dir; default: the model plus a hash of what is trained.", trains=False
    )
    runs_dir: str = option("runs", "Where runs live.", trains=False)
    seed: int = option(1234, "Seed for weights, data order and dropout.", minimum=0)
    log_interval: int = option(1, "Log metrics every N steps.", minimum=1, trains=False)
    metrics_port: int = option(
        9400,
        "Prometheus port of rank 0 (rank r serves on port + r); 0 disables.",
        minimum=0,
        maximum=65535,
        trains=False,
    )
    peak_tflops: float | None = option(
        None,
        "Peak TFLOP/s per device for MFU; default from the device table (no MFU on CPU without it).",
        above=0,
        trains=False,
    )
    profile: str = option("local", "Profile YAML the defaults came from.", trains=False, cli=False)
    workload: str = option(
        "recipe",
        "What the run starts: the model's recipe, a user's script, the collective sweep (nccl-test) or a data "
        "task; the model, data and optimisation fields describe a recipe only.",
        choices=WORKLOADS,
        trains=False,
        cli=False,
    )
    notes: list[str] = option(
        [], "Adjustments the launcher made to the defaults, shown to the user.", trains=False, cli=False
    )


@dataclass
class ModelOptions:
    """What is trained, and from which weights."""

    name: str = option(
        "llama2-tiny",
        "The model: a registry name (training/registry.py), or a Hugging Face causal LM as a hub id, a local model "
        "folder or its config.json. The BERT models train with a byte tokenizer (one token per byte), not BERT's "
        "WordPiece: their losses are not comparable to the published ones.",
        flag="model",
    )
    family: str | None = option(
        None,
        "The model's family (training/families.py): which trainer runs the job (from the model registry or the "
        "model's config).",
        choices=tuple(FAMILIES),
        trains=False,
        cli=False,
    )
    init: str = option(
        "random",
        "`random`: build from config, no download. `pretrained`: load weights from --weights.",
        choices=("random", "pretrained"),
    )
    weights: str | None = option(
        None,
        "Pretrained weights: a Hugging Face hub id or a local directory; default: the model's hub id.",
        family="decoder",
    )
    layers: int | None = option(
        None,
        "Truncate the model to this many layers (benchmarks and tests; labelled in every output).",
        minimum=1,
        family=TEXT_FAMILIES,
    )
    truncated_label: str | None = option(
        None, "Set when --layers truncates the model, so every output says so.", cli=False
    )


@dataclass
class DataOptions:
    """What the model reads."""

    dataset: str = option(
        SYNTHETIC,
        "`synthetic` (generated: dialogues for decoders, a text corpus for BERT, a 10-class JPEG tree for vision); "
        "for language models a local `.jsonl`, `.json` or `.parquet` file (BERT: also `.txt`), a folder of them, a "
        "folder saved with `datasets`, or a Hugging Face dataset name; for vision an ImageFolder root "
        "(train/<class>/, val/<class>/).",
        alias="data",
    )
    dataset_split: str = option("train", "Split to read from a Hugging Face dataset.")
    data_format: str | None = option(
        None,
        "Format of the records: `chat` ({messages: [{role, content}, ...]}, loss on assistant turns), `alpaca` "
        "(instruction, optional input, output), `prompt-response`, `dialogue-summary` (loss on the response or "
        "summary) or `text` (loss on every token; BERT reads only this); default: detected from the records.",
        choices=DATA_FORMATS,
        family=TEXT_FAMILIES,
    )
    packing: str | None = option(
        None,
        "Decoders: how examples share a packed sequence. `masked` (default): each example attends only to itself "
        "and its positions start at 0 (a block-diagonal mask built from per-example position ids); `concat`: "
        "examples attend across their boundaries (needed for --attention flash, whose kernel takes no mask).",
        choices=PACKINGS,
        family="decoder",
    )
    truncation: str | None = option(
        None,
        "Decoders, the supervised formats: an example longer than --seq-len (examples are packed whole, never "
        "split). `left` (default): its prompt loses tokens from the left (after <bos>) until it fits, or it is left "
        "out when its trained part alone does not fit; `drop`: it is left out. The start line counts both.",
        choices=TRUNCATIONS,
        family="decoder",
    )
    seq_len: int | None = option(
        None, "Tokens per packed sequence; at most the model's context length.", minimum=1, family=TEXT_FAMILIES
    )
    image_size: int | None = option(
        None,
        "Vision: training crop in pixels (validation resizes to size/0.875, centre-crops); default from the recipe.",
        minimum=1,
        family="vision",
    )
    synthetic: bool | None = option(
        None,
        "Vision: random tensors made on the device instead of images, to measure the compute ceiling.",
        family="vision",
        switch=True,
    )
    loader_workers: int | None = option(
        None,
        "Vision: data loader worker processes per training process (recipe: on GPUs the node's vCPUs / its "
        "processes, less 2, within 4-12; 1 on a CPU-only machine and for resnet-tiny).",
        minimum=0,
        family="vision",
        trains=False,
    )
    pin_memory: bool | None = option(
        None,
        "Vision: the loader hands batches over in page-locked host memory, copied to the GPU without blocking; "
        "default true on GPUs. Needs a GPU.",
        family="vision",
        trains=False,
    )
    persistent_workers: bool | None = option(
        None,
        "Vision: keep the loader's worker processes between passes (the evaluation loader's, every epoch); "
        "default true. Needs --loader-workers > 0.",
        family="vision",
        trains=False,
    )
    prefetch_factor: int | None = option(
        None,
        "Vision: batches each loader worker prepares ahead; default 4. Needs --loader-workers > 0.",
        minimum=1,
        family="vision",
        trains=False,
    )


@dataclass
class OptimisationOptions:
    """How long and how the model is optimised."""

    steps: int | None = option(
        None, "Optimizer steps to train; default from the model recipe unless --epochs is given.", minimum=1
    )
    epochs: int | None = option(None, "Passes over the packed dataset; alternative to --steps.", minimum=1)
    global_batch_size: int | None = option(
        None,
        "Sequences per optimizer step, all ranks together; default: the recipe's, rounded to a whole number per "
        "process (learning rate scaled to match).",
        minimum=1,
    )
    micro_batch_size: int | None = option(
        None,
        "Sequences per forward pass on one rank.",
        minimum=1,
        trains=False,  # how each rank's share of the global batch is split: the loss is the global batch's mean
    )
    global_batch_derived: bool = option(
        False,
        "Set when the launcher chose the global batch from the recipe for this world size; such a batch need not "
        "divide every size of an elastic range (ranks then get shares one apart).",
        trains=False,
        cli=False,
    )
    lr: float | None = option(None, "Peak learning rate.", above=0)
    lr_derived: bool = option(
        False,
        "Set when the launcher chose the learning rate (the recipe's, scaled with a derived global batch, or the "
        "vision rule's for the batch) rather than --lr.",
        trains=False,
        cli=False,
    )
    schedule: str = option(
        "cosine",
        "Learning-rate schedule after linear warmup: `cosine` (to 10% of the peak at the last step for decoders, "
        "to 0 for vision and BERT, as their references) or `constant`.",
        choices=("cosine", "constant"),
    )
    warmup_steps: int | None = option(None, "Linear warmup steps (or --warmup-epochs).", minimum=0)
    warmup_epochs: float | None = option(
        None, "Linear warmup in epochs (vision recipe: 5); alternative to --warmup-steps.", minimum=0, family="vision"
    )
    weight_decay: float | None = option(
        None,
        "Weight decay (decoders: AdamW, 0; BERT: LAMB, 0.01; vision: 1e-4; on matrices only for BERT and vision); "
        "default from the recipe.",
        minimum=0,
    )
    grad_clip: float | None = option(
        None,
        "Clip the global gradient norm to this value (0 disables); recipe: 1.0 for language models, 0 for vision.",
        minimum=0,
    )
    optimizer: str | None = option(
        None,
        "Vision: `sgd` (Nesterov momentum 0.9) or `lamb` (layer-wise adaptive, for large batches). BERT: `lamb` "
        "(the recipe's) or `adamw`. Llama fine-tuning uses AdamW.",
        choices=tuple(dict.fromkeys(name for family in FAMILIES.values() for name in family.optimizers)),
        family=tuple(name for name, family in FAMILIES.items() if family.optimizers),
    )
    label_smoothing: float | None = option(
        None, "Vision: label smoothing of the cross-entropy loss (recipe: 0.1).", minimum=0, below=1, family="vision"
    )


@dataclass
class ParallelismOptions:
    """How the job is spread over machines and processes."""

    nodes: int = option(
        1,
        "Nodes (machines) in the job; `MIN:MAX` (e.g. `1:2`) makes the job elastic between the two. On the "
        "local target each node is a torchrun agent on this machine. A run continues from its checkpoint at "
        "another size: the global batch, not the node count, says what it trains.",
        minimum=1,
        trains=False,
    )
    min_nodes: int | None = option(
        None,
        "Fewest nodes the job keeps training with (set by --nodes MIN:MAX); default: all of them.",
        minimum=1,
        trains=False,
        cli=False,
    )
    nproc: int | None = option(
        None,
        "Processes per node; default: all local GPUs, or 2 on a CPU-only machine (EKS: the instance's GPUs).",
        minimum=1,
        trains=False,
    )
    sharding: str | None = option(
        None,
        "FSDP strategy: FULL_SHARD, HYBRID_SHARD (shard in a node, replicate across), SHARD_GRAD_OP, "
        "NO_SHARD (DDP); or ZERO_1 (DeepSpeed ZeRO stage 1: the optimizer state partitioned over the ranks). "
        "Decoder models (Llama, Mistral, Qwen, Gemma, ...) default to FULL_SHARD, BERT to ZERO_1 (or NO_SHARD); "
        "vision models always train NO_SHARD.",
        choices=SHARDING_CHOICES,
    )
    precision: str = option(
        "auto",
        "`auto` (bf16 on GPUs that support it, fp32 on CPU), `bf16` or `fp32`.",
        choices=("auto", "bf16", "fp32"),
    )
    activation_checkpointing: bool | None = option(
        None,
        "Recompute each decoder layer's activations in backward; default from the model recipe.",
        family="decoder",
    )
    ac_every: int | None = option(
        None,
        "With activation checkpointing on: recompute every K-th decoder layer only (selective); default: the "
        "recipe's on GPUs (2 for llama2-7b and 13b), else 1: all.",
        minimum=1,
        trains=False,
        family="decoder",
    )
    prefetch: int | None = option(
        None,
        "FSDP2 explicit prefetch: each decoder layer starts the all-gathers of the next N layers in forward (the "
        "previous N in backward); default 0: FSDP2's implicit one-ahead.",
        minimum=0,
        trains=False,
        family="decoder",
    )
    reshard_last_layer: bool | None = option(
        None,
        "false: keep the last decoder layer's gathered weights from forward into backward (one all-gather less "
        "per step, one layer of weights more in memory); default true.",
        trains=False,
        family="decoder",
    )
    reduce_dtype: str | None = option(
        None,
        "Under bf16, the dtype FSDP2 reduce-scatters gradients in: `fp32` (default) or `bf16` (Accelerate's own "
        "default: half the bytes on the network, the sum rounded to bf16). BERT's ZeRO-1 always accumulates and "
        "reduces in fp32.",
        choices=("bf16", "fp32"),
        trains=False,  # rounding only: a run may resume with another
        family="decoder",
    )
    fused_adamw: bool | None = option(
        None,
        "AdamW's fused kernel (one kernel over all parameters, `fused=True`); default true on GPUs, the multi-tensor "
        "`foreach` kernel on CPU.",
        trains=False,  # rounding only: a run may resume with another
        family="decoder",
    )
    compile: bool | None = option(
        None,
        "true: torch.compile each decoder layer in place, before checkpoint wrappers and FSDP2 (regional "
        "compilation: identical layers share one graph; the first step pays the compile); default: the recipe's on "
        "GPUs (true for llama2-7b/13b/70b), else false.",
        trains=False,  # rounding only: a run may resume with another
        family="decoder",
    )
    channels_last: bool | None = option(
        None,
        "Vision: the model and its input batches in channels-last (NHWC) memory format, which GPU convolution "
        "kernels prefer; default true on GPUs, false on CPU.",
        trains=False,  # rounding only: a run may resume with another
        family="vision",
    )
    attention: str | None = option(
        None,
        "Attention kernel: `sdpa` (default: PyTorch picks), `flash` (FlashAttention only; fails where it cannot "
        "run) or `math` (the reference kernel).",
        choices=("sdpa", "flash", "math"),
        trains=False,  # rounding only: a run may resume with another
        family="decoder",
    )


@dataclass
class CheckpointingOptions:
    """When the run saves itself, and how much it keeps."""

    checkpoint_interval: int | None = option(
        None,
        "Save a checkpoint every N steps (0: only at the end; vision also saves at every epoch end).",
        minimum=0,
    )
    keep_checkpoints: int = option(2, "How many published checkpoints to keep.", minimum=1, trains=False)
    storage_mb_s: float | None = option(
        None,
        "Write throughput of the storage the run folder is on, MB/s: the stall watchdog allows a recipe's checkpoint "
        "and final export their bytes at this rate, x 1.5 (at least 10 min; a script's saves: --stall-timeout). "
        "Default: the FSx file system's throughput per TiB x its size (eks, batch); measured on the run folder's "
        "disk when a checkpoint is large enough for it to matter (local); on SageMaker each host's own volume, 131 "
        "(an EBS gp3 volume's baseline, 125 MiB/s), every host writing its part of a checkpoint at once.",
        above=0,
        trains=False,
    )
    storage_hosts: int = option(
        1,
        "How many hosts write a checkpoint's parts at once, each at --storage-mb-s to a volume of its own (SageMaker: "
        "every host); 1: one shared file system whose throughput is the whole. The export is one host's write.",
        minimum=1,
        trains=False,
        cli=False,
    )
    phase_bytes: dict[str, int] = option(
        {},
        "What the run writes in each of the stall watchdog's slow phases (`checkpoint`, `export`), in bytes.",
        trains=False,
        cli=False,
    )


@dataclass
class ElasticOptions:
    """How the job survives lost processes and nodes."""

    max_restarts: int = option(
        3,
        "Times the agents restart the workers after a failure before the job fails (batch: the job's attempts are "
        "this plus one, at most 10).",
        minimum=0,
        trains=False,
    )
    collective_timeout: int = option(
        600,
        "Seconds a collective waits for a silent peer (a hung GPU, a partitioned node) before the rank fails "
        "and the agents restart the group, instead of the job hanging.",
        minimum=1,
        trains=False,
    )
    stall_timeout: int | None = option(
        None,
        "Seconds a rank may go without finishing a step before the stall watchdog dumps every rank's stacks into "
        "its log and restarts the job from its last checkpoint (one of --max-restarts); 0 turns the watchdog off. "
        "Default: 10 x the median step, at least 60 s. A process's first steps get at least 10 min whatever this "
        "says; a checkpoint, an evaluation and the final export at least this and 10 min, and what they write at "
        "--storage-mb-s x 1.5. Also 90s, 5m.",
        minimum=0,
        trains=False,
        duration=True,
    )
    rdzv: str | None = option(
        None,
        "Rendezvous backend: `c10d` (a store hosted by node 0) or `etcd` (a store outside the nodes, which "
        "survives the loss of any node). Default: c10d locally, etcd (the platform's) on EKS.",
        choices=("c10d", "etcd"),
        trains=False,
    )
    rdzv_endpoint: str | None = option(
        None,
        "host:port of the rendezvous store; local default: a free port on 127.0.0.1 (c10d) or the etcd "
        "`make up` started; EKS: worker 0 (c10d) or the platform's etcd service.",
        trains=False,
    )


@dataclass
class PlacementOptions:
    """Where the job runs."""

    target: str = option(
        "local",
        "Where the job runs: `local` (processes on this machine), `eks` (a PyTorchJob on the cluster), "
        "`sagemaker` (a SageMaker training job) or `batch` (an AWS Batch multi-node parallel job).",
        choices=TARGETS,
        trains=False,
    )
    instance_type: str | None = option(
        None,
        "EKS: GPU instance type of the nodes, which sets --nproc; default: the infra stack's, else p5.48xlarge.",
        trains=False,
    )
    image: str | None = option(
        None,
        "EKS: training image; default: the one `invoke images.push` pushed to the infra stack's ECR repository.",
        trains=False,
    )
    namespace: str | None = option(
        None, "EKS: namespace of the job; default: trainkit-jobs (made by the platform stack).", trains=False
    )
    hf_token_file: str | None = option(
        None, "File holding a Hugging Face token (the token itself is never part of the job).", trains=False
    )
    max_runtime: int | None = option(
        None,
        "The job's deadline in seconds (or 90m, 4h, 2d), counted afresh at each launch; past it the job stops (a "
        "checkpoint when time allows) and fails. local: from when its processes start, exit code 124; eks: "
        "runPolicy.activeDeadlineSeconds, from the PyTorchJob's first reconcile (the operator deletes its pods); "
        "sagemaker: the stopping condition; batch: each attempt's timeout (at least 60 s). Default: none "
        "(sagemaker: SageMaker's own 1 day).",
        minimum=1,
        trains=False,
        duration=True,
    )
    spot: bool | None = option(
        None,
        "SageMaker: managed spot training; an interrupted job restarts from its last checkpoint, which SageMaker "
        "restores from S3.",
        trains=False,
        switch=True,
    )
    max_wait: int | None = option(
        None,
        "SageMaker with --spot: how long the job may wait for spot capacity and run, in all (seconds, or 90m, 4h, "
        "2d); at least --max-runtime; default twice it.",
        minimum=1,
        trains=False,
        duration=True,
    )


@dataclass
class Job:
    """Everything a training job needs, whatever runs it."""

    run: RunOptions = field(default_factory=RunOptions)
    model: ModelOptions = field(default_factory=ModelOptions)
    data: DataOptions = field(default_factory=DataOptions)
    optimisation: OptimisationOptions = field(default_factory=OptimisationOptions)
    parallelism: ParallelismOptions = field(default_factory=ParallelismOptions)
    checkpointing: CheckpointingOptions = field(default_factory=CheckpointingOptions)
    elastic: ElasticOptions = field(default_factory=ElasticOptions)
    placement: PlacementOptions = field(default_factory=PlacementOptions)

    # ------------------------------------------------------------------ derived values

    @property
    def world_size(self) -> int:
        return self.parallelism.nodes * int(self.parallelism.nproc or 1)

    @property
    def grad_accum_steps(self) -> int:
        o = self.optimisation
        return o.global_batch_size // (o.micro_batch_size * self.world_size)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.runs_dir) / str(self.run.run_id)

    # ------------------------------------------------------------------ spec.json

    def to_dict(self) -> dict[str, Any]:
        data = {"version": SPEC_VERSION, **dataclasses.asdict(self)}
        batches = self.optimisation.global_batch_size and self.optimisation.micro_batch_size  # a recipe's only
        data["derived"] = {
            "world_size": self.world_size,
            "grad_accum_steps": self.grad_accum_steps if batches else None,
        }
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        """The job `to_dict` wrote; a flat spec.json of an earlier trainkit (one object, the fields' own
        names) is read too, so older runs can be resumed and reported."""
        job = cls()
        nested = "version" in data
        for spec in FIELDS:
            source = data.get(spec.section, {}) if nested else data
            key = spec.name if nested else spec.legacy_name
            if key in source:
                setattr(getattr(job, spec.section), spec.name, source[key])
        job.model.family = FORMER_NAMES.get(job.model.family, job.model.family)
        if "lr_derived" not in data.get("optimisation", {}):
            # written before the launcher said whose learning rate it was: the run's own counts as chosen, so it is
            # kept where a launch chooses one (a launch that gives --lr must give the run's)
            job.optimisation.lr_derived = True
        return job

    def fingerprint(self) -> str:
        """Hash of the fields that change what is trained (not where logs go, how it is launched or on how many
        processes). A global batch or learning rate the launcher chose counts as the recipe's, whichever world
        size rounded it: the same command at another size names the same run."""
        relevant = {spec.path: spec.get(self) for spec in FIELDS if spec.trains}
        o = self.optimisation
        if o.global_batch_derived:
            relevant["optimisation.global_batch_size"] = "recipe"
        if o.lr_derived:
            relevant["optimisation.lr"] = "recipe"
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:8]


SECTIONS: dict[str, type] = typing.get_type_hints(Job)


@dataclass(frozen=True)
class FieldSpec:
    """One declared option: where it lives, its type and its metadata."""

    section: str
    name: str
    kind: type
    default: Any
    meta: dict[str, Any]

    @property
    def path(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def flag(self) -> str:
        return "--" + (self.meta["flag"] or self.name).replace("_", "-")

    @property
    def key(self) -> str:
        """The flag as a Python identifier (what Invoke passes the task)."""
        return (self.meta["flag"] or self.name).replace("-", "_")

    @property
    def legacy_name(self) -> str:
        """The field's name in the flat spec.json of trainkit before sections."""
        return {"model.name": "model"}.get(self.path, self.name)

    def __getattr__(self, item: str) -> Any:  # help, choices, minimum, ... straight from the metadata
        try:
            return self.meta[item]
        except KeyError:
            raise AttributeError(item) from None

    def get(self, job: Job) -> Any:
        return getattr(getattr(job, self.section), self.name)

    def set(self, job: Job, value: Any) -> None:
        setattr(getattr(job, self.section), self.name, value)


def _base_type(annotation: Any) -> type:
    """`int | None` -> int; `list[str]` -> list."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is list:
        return list
    return args[0] if args else annotation


def _declared() -> tuple[FieldSpec, ...]:
    specs = []
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = [] if f.default_factory is list else f.default
            specs.append(FieldSpec(section, f.name, _base_type(hints[f.name]), default, dict(f.metadata)))
    return tuple(specs)


FIELDS: tuple[FieldSpec, ...] = _declared()
BY_KEY: dict[str, FieldSpec] = {spec.key: spec for spec in FIELDS}


def fields_of(cli: bool) -> Iterator[FieldSpec]:
    """The fields that are (or are not) command-line options."""
    return (spec for spec in FIELDS if spec.cli == cli)


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str, flag: str) -> int:
    """`3600`, `90m`, `4h`, `2d` as seconds; anything else is refused naming the flag (a field's minimum refuses 0
    where 0 means nothing)."""
    value = text.strip().lower()
    number, unit = (value[:-1], value[-1]) if value[-1:] in DURATION_UNITS else (value, "s")
    if not number.isdigit():
        raise ValueError(f"{flag} {text!r}: give a whole number of seconds, or minutes, hours or days (90m, 4h, 2d)")
    return int(number) * DURATION_UNITS[unit]


def range_problem(spec: FieldSpec, value: Any) -> str | None:
    """What is wrong with a number for this field (type, finiteness, bounds), or None."""
    if value is None or spec.kind not in (int, float):
        return None
    if spec.kind is int and (not isinstance(value, int) or isinstance(value, bool)):
        return f"must be an integer (got {value!r})"
    if spec.kind is float and not isinstance(value, int | float):
        return f"must be a number (got {value!r})"
    if not math.isfinite(value):
        return f"must be a finite number (got {value!r})"
    low, high, above, below = spec.minimum, spec.maximum, spec.above, spec.below
    if spec.kind is int and low is not None and high is not None:
        ok, wanted = low <= value <= high, f"an integer in {low}..{high}"
    elif spec.kind is int and low is not None:
        ok, wanted = value >= low, f"a {'positive' if low == 1 else 'non-negative'} integer"
    elif above is not None:
        ok, wanted = value > above, "positive" if above == 0 else f"> {above:g}"
    elif low is not None and below is not None:
        ok, wanted = low <= value < below, f"in [{low:g}, {below:g})"
    elif low is not None:
        ok, wanted = value >= low, f">= {low:g}"
    else:
        ok, wanted = True, ""
    return None if ok else f"must be {wanted} (got {value!r})"


def read_job(path: str | Path) -> Job:
    """The job a run's spec.json describes (what every worker starts from)."""
    return Job.from_dict(json.loads(Path(path).read_text()))


# ---------------------------------------------------------------------- files the launcher prepares

MODEL_CONFIG = "model_config.json"
"""In the run folder: what the workers build a randomly initialised model from (language models: a
Hugging Face config.json; vision: the class count of synthetic input)."""
RANK_LOGS_DIR = "ranks"
RUN_DIR_ENV = "TRAINKIT_RUN_DIR"
"""Every process of a run finds its run folder here (the launcher sets it; a user's script reads it)."""
CHECKPOINT_DIR_ENV = "TRAINKIT_CHECKPOINT_DIR"
"""A user's script keeps its checkpoints here (training/script.py)."""
SCRIPT_LABEL_ENV = "TRAINKIT_SCRIPT"
"""A user's script's name, for its metrics' `model` label."""
"""logs/<this>/<rank>.json in the run folder: the files torchrun sends each rank's output to, recorded
by the rank itself (`invoke logs --rank`)."""
METRICS_PORT_OFFSET_ENV = "TRAINKIT_METRICS_PORT_OFFSET"
"""Added to the metrics port by launchers that run several nodes on one machine, so each node's ranks
get their own block of ports (rank r of the job serves port + r, as on one node)."""
PROGRESS_ENV = "TRAINKIT_PROGRESS"
"""How rank 0 shows progress: `bar` (a tqdm bar; the launcher sets it when its console is a terminal) or,
by default, `lines` (one plain line per tenth of the run: logs, pipes and `kubectl logs`)."""
SYNTHETIC_DIALOGUES = FAMILIES["decoder"].synthetic
SYNTHETIC_IMAGES = FAMILIES["vision"].synthetic
SYNTHETIC_CORPUS = FAMILIES["bert"].synthetic


DATA_MOUNT_ENV = "TRAINKIT_DATA_MOUNT"
"""The folder where the target mounted an s3:// dataset (SageMaker: the job's `data` channel). The run's spec keeps
the URL as given, so a run resubmitted with other data is still refused as another run."""


def dataset_path(job: Job) -> str:
    """The dataset as this machine reads it: an s3:// URL where the target mounted it (DATA_MOUNT_ENV), anything
    else as given. A URL that does not end in `/` may name one object, or a prefix whose last part SageMaker keeps
    as a folder: what the mount holds under that name is the dataset, else the mount itself."""
    dataset, mount = job.data.dataset, os.environ.get(DATA_MOUNT_ENV)
    if not (mount and dataset.startswith("s3://")):
        return dataset
    named = Path(mount) / dataset.rsplit("/", 1)[-1]
    return str(named) if not dataset.endswith("/") and named.exists() else mount


def data_source(job: Job, run_dir: Path) -> str:
    """Where the workers read the dataset: the data the launcher generated into the run folder for
    `synthetic`, else the user's path (home expanded, as the launcher checked it; where the target mounted an
    s3:// one) or a hub name."""
    if job.data.dataset == SYNTHETIC:
        return str(run_dir / family_of(job.model.family or "decoder").synthetic)
    path = Path(dataset_path(job)).expanduser()
    return str(path) if path.exists() else job.data.dataset


def worker_arguments(run_dir: Path) -> list[str]:
    """The training entry points' only argument: the run's spec.json."""
    return ["--spec", str(run_dir / SPEC_FILE)]


def parse_worker_arguments(argv: list[str] | None, description: str) -> tuple[Job, Path]:
    """(job, run folder) from `--spec runs/<run-id>/spec.json`: the run folder is where spec.json is."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--spec", required=True, help="The run's spec.json, written by the launcher.")
    path = Path(parser.parse_args(argv).spec)
    return read_job(path), path.parent
