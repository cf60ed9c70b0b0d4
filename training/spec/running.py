"""How and where a job runs: its parallelism, checkpointing, elastic and placement sections (the option
schema, training/spec/)."""

from __future__ import annotations

from dataclasses import dataclass

from training.spec.options import SHARDING_CHOICES, TARGETS, option


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
