"""What each model brings to the job spec besides its shape: its recipe (batch, schedule, sharding and the rest),
by model family and size. The registry (training/registry.py) names one per model. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from training.decoders import DecoderArch


@dataclass(frozen=True)
class Recipe:
    """Defaults a model brings to the job spec (JobSpec field names); flags and profiles override them.
    None leaves the field to the spec's own rules."""

    global_batch_size: int
    micro_batch_size: int
    sharding: str
    weight_decay: float
    grad_clip: float
    checkpoint_interval: int
    steps: int | None = None
    epochs: int | None = None
    lr: float | None = None
    warmup_steps: int | None = None
    warmup_epochs: float | None = None
    seq_len: int | None = None
    activation_checkpointing: bool | None = None
    image_size: int | None = None
    optimizer: str | None = None
    label_smoothing: float | None = None
    loader_workers: int | None = None
    loader_workers_from_cpus: bool = False
    """On GPUs, size the loader workers from the node's CPUs (trainkit/job/derive.py `cpu_sized_loader_workers`),
    never below `loader_workers`; a given --loader-workers is kept."""
    ac_every: int | None = None
    compile: bool | None = None
    cpu: dict = field(default_factory=dict)
    """Overrides used instead on a machine without GPUs, for fields no flag or profile set."""


GPU_ONLY = ("ac_every", "compile")
"""Recipe fields chosen by measurement on a GPU: a machine without one keeps the spec's own defaults for them."""


def finetune_recipe(micro_batch_size: int) -> Recipe:
    """Full fine-tuning of a pretrained Llama 2 at its native context."""
    return Recipe(
        steps=1000,
        global_batch_size=64,
        micro_batch_size=micro_batch_size,
        sharding="FULL_SHARD",
        weight_decay=0.0,
        grad_clip=1.0,
        seq_len=4096,
        lr=2e-5,
        warmup_steps=30,
        checkpoint_interval=200,
        activation_checkpointing=True,
        # GPU fast paths, measured (benchmarks/llama2-7b-sweep-h200.json, a 4-layer 7B shape at seq 2048 and
        # 4096, one H200): recomputing every 2nd layer instead of all and compiling each layer gave 79.8k
        # tokens/s against 61.0k at seq 2048 (48.8% against 37.3% MFU), 78.9k against 71.3k (compiled) at 4096.
        ac_every=2,
        compile=True,
        # A 7B-shaped layer stack runs ~10 s per 256 tokens on two CPU cores: keep CPU smoke runs short.
        cpu={"global_batch_size": 2, "micro_batch_size": 1},
    )


def decoder_recipe(arch: DecoderArch) -> Recipe:
    """Full fine-tuning of any other causal LM: the Llama 2 recipe at the model's context up to 4,096 tokens, with
    the micro batch the Llama 2 entries take at its size (4 up to 7B-class, 2 up to 13B-class, else 1). The GPU fast
    paths were measured on Llama 2 7B only: the spec's own defaults (no selective recomputation, no compiling)."""
    n = arch.parameters()
    micro = 4 if n < 8e9 else 2 if n < 16e9 else 1
    return replace(
        finetune_recipe(micro_batch_size=micro),
        seq_len=min(4096, arch.max_position_embeddings),
        ac_every=None,
        compile=None,
    )


def tiny_recipe() -> Recipe:
    """Fast local demo: learns the synthetic dialogue data in about a minute on two CPU processes."""
    return replace(
        finetune_recipe(micro_batch_size=8),
        steps=60,
        global_batch_size=16,
        seq_len=128,
        lr=3e-3,
        warmup_steps=6,
        checkpoint_interval=20,
        activation_checkpointing=False,
        ac_every=None,
        compile=None,  # a 60-step demo: compiling would cost more than it saves
        cpu={},  # already sized for CPU
    )


def imagenet_recipe(global_batch: int, micro_batch: int, image_size: int) -> Recipe:
    """ImageNet from scratch with SGD + Nesterov: 90 epochs, 5 warmup epochs, cosine, label smoothing
    0.1, weight decay 1e-4 on conv/linear weights. The learning rate follows the linear scaling rule
    (0.1 per 256 images, Goyal et al. 2017) unless --lr is given. On GPUs the loader workers per process
    follow the node's CPUs, 4 to 12 (trainkit/job/derive.py says why)."""
    return Recipe(
        epochs=90,
        global_batch_size=global_batch,
        micro_batch_size=micro_batch,
        sharding="NO_SHARD",
        weight_decay=1e-4,
        grad_clip=0.0,
        checkpoint_interval=0,
        warmup_epochs=5,
        image_size=image_size,
        optimizer="sgd",
        label_smoothing=0.1,
        loader_workers=4,
        loader_workers_from_cpus=True,
        # A CPU smoke run: small batches, one loader worker per process on a two-core machine.
        cpu={"global_batch_size": 8, "micro_batch_size": 4, "loader_workers": 1},
    )


def resnet_tiny_recipe() -> Recipe:
    """Local demo on the synthetic JPEG tree: learns its 10 classes in a few epochs on two CPU processes."""
    return replace(
        imagenet_recipe(global_batch=40, micro_batch=20, image_size=32),
        epochs=6,
        warmup_epochs=1,
        loader_workers=1,
        loader_workers_from_cpus=False,  # the demo's one worker everywhere: the rule was measured on 224 px crops
        cpu={},
    )


def bert_recipe(micro_batch_size: int) -> Recipe:
    """Phase-1 masked-language-model pretraining as the reference setup ran it (issue 31: the AWS blog post on
    DeepSpeed BERT 1.5B on DL1, whose table trainkit/tables/published_scaling.json holds): 16 sequences of 128
    tokens per accelerator and step x 24 accumulation steps, 384 per accelerator, so a global batch of 24,576 on
    8 nodes of 8, at learning rate 0.0015. trainkit keeps that global batch at every node count (a run's result
    does not depend on how many nodes train it); the reference doubled batch and rate at 16 nodes: give
    `--global-batch-size 49152 --lr 0.003` for that. The rest is the reference's model repository
    (HabanaAI/Model-References, PyTorch/nlp/DeepSpeedExamples/deepspeed-bert at 06bfc5e, scripts/
    run_bert_1.5b_8x.sh and deepspeed_config_bert_1.5b.json; release 1.7.0 at 9390986): 5% warmup (7,750 of the
    155,000 steps: a count, so a shorter --steps wants its own --warmup-steps), weight decay 0.01 (none on biases
    and LayerNorm), gradient clipping 1.0, 155,000 steps, a checkpoint every 200, ZeRO stage 1 in bf16. Their
    optimizer was LANS (NVLAMB in release 1.5.0); trainkit trains with LAMB (training/common/lamb.py), the NVLAMB
    family, and its own cosine schedule instead of their polynomial one. Masks are drawn per batch
    (training/encoder/masking.py), not ahead of time as their hdf5 files hold them."""
    return Recipe(
        steps=155_000,
        global_batch_size=24_576,
        micro_batch_size=micro_batch_size,
        sharding="ZERO_1",
        weight_decay=0.01,
        grad_clip=1.0,
        checkpoint_interval=200,
        lr=0.0015,
        warmup_steps=7_750,
        seq_len=128,
        optimizer="lamb",
        # A CPU smoke run of a large shape: a few small steps.
        cpu={"global_batch_size": 4, "micro_batch_size": 2, "steps": 10, "warmup_steps": 2},
    )


def bert_tiny_recipe() -> Recipe:
    """Local demo and tests on the generated corpus: two CPU processes, about a minute."""
    return replace(
        bert_recipe(micro_batch_size=8),
        steps=60,
        global_batch_size=32,
        seq_len=64,
        lr=0.01,
        warmup_steps=6,
        checkpoint_interval=20,
        cpu={},
    )
