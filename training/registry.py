"""The model registry, the only name -> model table: each model's family (which trainer runs it), architecture,
default recipe, builder and where pretrained weights live. Torch-free: the launcher reads it to plan and check a
job without PyTorch, and the worker reads it to pick its trainer; builders and trainers are named "module:function"
and imported only when called (`load`), so reading the registry imports no model code.

Llama 2 shapes are the published ones (Touvron et al. 2023, table 1 and the Hugging Face
`config.json` of each `meta-llama/Llama-2-*-hf` repository): vocabulary 32,000, context 4,096,
grouped-query attention with 8 KV heads for 70B only. Any other causal LM is read from its Hugging Face
`config.json` (training/decoders.py: `DecoderArch.from_config`; trainkit/job/models.py resolves a hub id, folder or
file to one): the model types of `DECODER_TYPES`, each sized from what its transformers 5.23 modeling file builds.

BERT shapes are the published ones (Devlin et al. 2019, BERT-Large; the 1.5B of the reference setup, cited at
its entry): vocabulary 30,522 (bert-large-uncased), 512 positions, two token types.

Vision models are torchvision's (`training/vision/models.py` builds them); parameter counts are
those of the 1000-class models and are checked against the built model in the tests. Training crops
are the ones torchvision publishes with its ImageNet weights (`ResNet50_Weights.IMAGENET1K_V1`: 224,
`EfficientNet_B7_Weights.IMAGENET1K_V1`: 600).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace

from training.common.flops import TransformerShape
from training.decoders import DECODER_TYPES, DecoderArch, decoder_refusal

__all__ = ["DECODER_TYPES", "REGISTRY", "DecoderArch", "ModelEntry", "Recipe", "decoder_refusal", "load", "model_entry"]


@dataclass(frozen=True)
class BertArch:
    """A BERT encoder, in the field names of `transformers.BertConfig`, trained as `BertForMaskedLM`."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int = 30522
    max_position_embeddings: int = 512
    type_vocab_size: int = 2

    def truncated(self, layers: int | None) -> BertArch:
        return self if layers is None else replace(self, num_hidden_layers=layers)

    def shape(self) -> TransformerShape:
        """For the FLOPs formula: multi-head attention (no grouped KV), an ungated GELU MLP."""
        h = self.hidden_size
        heads = self.num_attention_heads
        return TransformerShape(self.num_hidden_layers, h, heads, heads, self.intermediate_size, self.vocab_size, False)

    def parameters(self) -> int:
        """BertForMaskedLM's exact count: embeddings (word, position, type, LayerNorm), each layer (q, k, v, o,
        the MLP's two matrices, their biases, two LayerNorms), the MLM head's transform (dense and LayerNorm) and
        output bias; the head's output matrix is the word embedding, tied."""
        h, i, layers = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * h + 2 * h
        layer = 4 * (h * h + h) + 2 * h * i + i + h + 4 * h
        head = h * h + h + 2 * h + self.vocab_size
        return embeddings + layers * layer + head

    def hf_config(self) -> dict:
        """A `config.json` body that `transformers.BertConfig` / `AutoConfig` accept."""
        return {
            "model_type": "bert",
            "architectures": ["BertForMaskedLM"],
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size,
            "hidden_act": "gelu",
            "layer_norm_eps": 1e-12,
            "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1,
            "pad_token_id": 0,
        }


@dataclass(frozen=True)
class VisionArch:
    """An image classifier from torchvision, at ImageNet's 1000 classes."""

    parameters: int
    image_size: int
    num_classes: int = 1000


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


BERT_BUILDER = "training.encoder.model:build_model"
"""Every BERT is built from its `config.json`, randomly initialised: (model_config, seed) -> BertForMaskedLM."""

DECODER_BUILDER = "training.llm.model:build_model"
"""Every decoder is built from its `config.json` (random init) or its weights: (model_config, weights, seed,
materialize) -> the `AutoModelForCausalLM` of its model_type."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    family: str
    arch: DecoderArch | VisionArch | BertArch
    recipe: Recipe
    builder: str
    """"module:function" that builds the model (vision: num_classes -> torch.nn.Module; decoders: `DECODER_BUILDER`)."""
    hub_id: str | None = None
    """Where pretrained weights come from: a hub id, or a local model folder."""
    notes: str = field(default="")
    label: str = ""
    """A short name that is safe in a run id and a file name (a hub id or folder has slashes); default: the name."""

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.name)


def _finetune_recipe(micro_batch_size: int) -> Recipe:
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
        _finetune_recipe(micro_batch_size=micro),
        seq_len=min(4096, arch.max_position_embeddings),
        ac_every=None,
        compile=None,
    )


def _tiny_recipe() -> Recipe:
    """Fast local demo: learns the synthetic dialogue data in about a minute on two CPU processes."""
    return replace(
        _finetune_recipe(micro_batch_size=8),
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


def _imagenet_recipe(global_batch: int, micro_batch: int, image_size: int) -> Recipe:
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


def _resnet_tiny_recipe() -> Recipe:
    """Local demo on the synthetic JPEG tree: learns its 10 classes in a few epochs on two CPU processes."""
    return replace(
        _imagenet_recipe(global_batch=40, micro_batch=20, image_size=32),
        epochs=6,
        warmup_epochs=1,
        loader_workers=1,
        loader_workers_from_cpus=False,  # the demo's one worker everywhere: the rule was measured on 224 px crops
        cpu={},
    )


def _bert_recipe(micro_batch_size: int) -> Recipe:
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


def _bert_tiny_recipe() -> Recipe:
    """Local demo and tests on the generated corpus: two CPU processes, about a minute."""
    return replace(
        _bert_recipe(micro_batch_size=8),
        steps=60,
        global_batch_size=32,
        seq_len=64,
        lr=0.01,
        warmup_steps=6,
        checkpoint_interval=20,
        cpu={},
    )


ENTRIES = (
    ModelEntry(
        name="llama2-7b",
        builder=DECODER_BUILDER,
        family="decoder",
        arch=DecoderArch(4096, 32, 32, 32, 11008),
        recipe=_finetune_recipe(micro_batch_size=4),
        hub_id="meta-llama/Llama-2-7b-hf",
    ),
    ModelEntry(
        name="llama2-13b",
        builder=DECODER_BUILDER,
        family="decoder",
        arch=DecoderArch(5120, 40, 40, 40, 13824),
        recipe=_finetune_recipe(micro_batch_size=2),
        hub_id="meta-llama/Llama-2-13b-hf",
    ),
    ModelEntry(
        name="llama2-70b",
        builder=DECODER_BUILDER,
        family="decoder",
        arch=DecoderArch(8192, 80, 64, 8, 28672),
        # Every layer recomputed: keeping half of 80 layers' activations (~46 GiB at seq 4096, `invoke plan`)
        # would not fit an 80 GB GPU below 8 p5 nodes.
        recipe=replace(_finetune_recipe(micro_batch_size=1), ac_every=None),
        hub_id="meta-llama/Llama-2-70b-hf",
    ),
    ModelEntry(
        name="llama2-tiny",
        builder=DECODER_BUILDER,
        family="decoder",
        # Llama 2 architecture (RMSNorm, SwiGLU, RoPE, grouped-query attention) at ~3.2M parameters,
        # with a 512-entry vocabulary that fits the byte tokenizer.
        arch=DecoderArch(256, 4, 4, 2, 688, vocab_size=512, max_position_embeddings=512),
        recipe=_tiny_recipe(),
        notes="debug model; random init only unless --weights points at a local checkpoint",
    ),
    ModelEntry(
        name="bert-large",
        builder=BERT_BUILDER,
        family="bert",
        arch=BertArch(1024, 24, 16, 4096),  # Devlin et al. 2019, BERT-Large: L=24, H=1024, A=16
        recipe=_bert_recipe(micro_batch_size=16),
        notes="BERT-Large, pretrained from scratch (masked LM); the reference setup's baseline",
    ),
    ModelEntry(
        name="bert-1.5b",
        builder=BERT_BUILDER,
        family="bert",
        # The reference's scripts/bert_1.5b_config.json: 48 layers, hidden 1600, 25 heads, intermediate 6400.
        arch=BertArch(1600, 48, 25, 6400),
        recipe=_bert_recipe(micro_batch_size=16),
        notes="the reference setup's 1.5B BERT, pretrained from scratch (masked LM)",
    ),
    ModelEntry(
        name="bert-tiny",
        builder=BERT_BUILDER,
        family="bert",
        # BERT's architecture at ~0.5M parameters, with a vocabulary that fits the byte tokenizer (5 + 256 ids).
        arch=BertArch(128, 2, 2, 512, vocab_size=264),
        recipe=_bert_tiny_recipe(),
        notes="debug model; random init",
    ),
    ModelEntry(
        name="resnet50",
        builder="training.vision.models:resnet50",
        family="vision",
        arch=VisionArch(parameters=25_557_032, image_size=224),
        recipe=_imagenet_recipe(global_batch=1024, micro_batch=128, image_size=224),
    ),
    ModelEntry(
        name="efficientnet-b7",
        builder="training.vision.models:efficientnet_b7",
        family="vision",
        arch=VisionArch(parameters=66_347_960, image_size=600),
        # 600 px crops: 8 images per GPU forward, accumulated to 256 per step on 8 GPUs.
        recipe=_imagenet_recipe(global_batch=256, micro_batch=8, image_size=600),
        notes="BatchNorm synced across GPUs (SyncBatchNorm): 8 images per GPU are too few for its statistics",
    ),
    ModelEntry(
        name="resnet-tiny",
        builder="training.vision.models:resnet_tiny",
        family="vision",
        arch=VisionArch(parameters=4_910_922, image_size=32, num_classes=10),
        recipe=_resnet_tiny_recipe(),
        notes="debug model: torchvision ResNet with one BasicBlock per stage",
    ),
)

REGISTRY: dict[str, ModelEntry] = {entry.name: entry for entry in ENTRIES}


def model_entry(name: str) -> ModelEntry:
    """The registry's entry for `name`; a name it does not hold is a ValueError that lists the ones it does."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"--model {name!r} is not a known model; choose one of: {', '.join(REGISTRY)}") from None


def load(reference: str):
    """The object a "module:name" reference names, its module imported now (and once: Python keeps it)."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)
