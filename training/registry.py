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
from typing import Any

from training.common.flops import TransformerShape
from training.decoders import DECODER_TYPES, DecoderArch, decoder_refusal
from training.recipes import (
    GPU_ONLY,
    Recipe,
    bert_recipe,
    bert_tiny_recipe,
    decoder_recipe,
    finetune_recipe,
    imagenet_recipe,
    resnet_tiny_recipe,
    tiny_recipe,
)

__all__ = [
    "DECODER_TYPES",
    "GPU_ONLY",
    "REGISTRY",
    "DecoderArch",
    "ModelEntry",
    "Recipe",
    "decoder_recipe",
    "decoder_refusal",
    "load",
    "model_entry",
    "register_model",
]


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


BERT_BUILDER = "training.encoder.model:build_model"
"""Every BERT is built from its `config.json`, randomly initialised: (model_config, seed) -> BertForMaskedLM."""

DECODER_BUILDER = "training.llm.model:build_model"
"""Every decoder is built from its `config.json` (random init) or its weights: (model_config, weights, seed,
materialize) -> the `AutoModelForCausalLM` of its model_type."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    family: str
    arch: DecoderArch | VisionArch | BertArch | Any
    """Its shape: one of the three here, or a registered family's own (`register_model`)."""
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


ENTRIES = (
    ModelEntry(
        name="llama2-7b",
        builder=DECODER_BUILDER,
        family="decoder",
        arch=DecoderArch(4096, 32, 32, 32, 11008),
        recipe=finetune_recipe(micro_batch_size=4),
        hub_id="meta-llama/Llama-2-7b-hf",
    ),
    ModelEntry(
        name="llama2-13b",
        builder=DECODER_BUILDER,
        family="decoder",
        arch=DecoderArch(5120, 40, 40, 40, 13824),
        recipe=finetune_recipe(micro_batch_size=2),
        hub_id="meta-llama/Llama-2-13b-hf",
    ),
    ModelEntry(
        name="llama2-70b",
        builder=DECODER_BUILDER,
        family="decoder",
        arch=DecoderArch(8192, 80, 64, 8, 28672),
        # Every layer recomputed: keeping half of 80 layers' activations (~46 GiB at seq 4096, `invoke plan`)
        # would not fit an 80 GB GPU below 8 p5 nodes.
        recipe=replace(finetune_recipe(micro_batch_size=1), ac_every=None),
        hub_id="meta-llama/Llama-2-70b-hf",
    ),
    ModelEntry(
        name="llama2-tiny",
        builder=DECODER_BUILDER,
        family="decoder",
        # Llama 2 architecture (RMSNorm, SwiGLU, RoPE, grouped-query attention) at ~3.2M parameters,
        # with a 512-entry vocabulary that fits the byte tokenizer.
        arch=DecoderArch(256, 4, 4, 2, 688, vocab_size=512, max_position_embeddings=512),
        recipe=tiny_recipe(),
        notes="debug model; random init only unless --weights points at a local checkpoint",
    ),
    ModelEntry(
        name="bert-large",
        builder=BERT_BUILDER,
        family="bert",
        arch=BertArch(1024, 24, 16, 4096),  # Devlin et al. 2019, BERT-Large: L=24, H=1024, A=16
        recipe=bert_recipe(micro_batch_size=16),
        notes="BERT-Large, pretrained from scratch (masked LM); the reference setup's baseline",
    ),
    ModelEntry(
        name="bert-1.5b",
        builder=BERT_BUILDER,
        family="bert",
        # The reference's scripts/bert_1.5b_config.json: 48 layers, hidden 1600, 25 heads, intermediate 6400.
        arch=BertArch(1600, 48, 25, 6400),
        recipe=bert_recipe(micro_batch_size=16),
        notes="the reference setup's 1.5B BERT, pretrained from scratch (masked LM)",
    ),
    ModelEntry(
        name="bert-tiny",
        builder=BERT_BUILDER,
        family="bert",
        # BERT's architecture at ~0.5M parameters, with a vocabulary that fits the byte tokenizer (5 + 256 ids).
        arch=BertArch(128, 2, 2, 512, vocab_size=264),
        recipe=bert_tiny_recipe(),
        notes="debug model; random init",
    ),
    ModelEntry(
        name="resnet50",
        builder="training.vision.models:resnet50",
        family="vision",
        arch=VisionArch(parameters=25_557_032, image_size=224),
        recipe=imagenet_recipe(global_batch=1024, micro_batch=128, image_size=224),
    ),
    ModelEntry(
        name="efficientnet-b7",
        builder="training.vision.models:efficientnet_b7",
        family="vision",
        arch=VisionArch(parameters=66_347_960, image_size=600),
        # 600 px crops: 8 images per GPU forward, accumulated to 256 per step on 8 GPUs.
        recipe=imagenet_recipe(global_batch=256, micro_batch=8, image_size=600),
        notes="BatchNorm synced across GPUs (SyncBatchNorm): 8 images per GPU are too few for its statistics",
    ),
    ModelEntry(
        name="resnet-tiny",
        builder="training.vision.models:resnet_tiny",
        family="vision",
        arch=VisionArch(parameters=4_910_922, image_size=32, num_classes=10),
        recipe=resnet_tiny_recipe(),
        notes="debug model: torchvision ResNet with one BasicBlock per stage",
    ),
)

REGISTRY: dict[str, ModelEntry] = {entry.name: entry for entry in ENTRIES}


def register_model(entry: ModelEntry) -> ModelEntry:
    """Add a model of a family declared outside trainkit (a family module's MODELS, training/families.py). Its name
    must be new; its family is registered first (training/families.py `load_family_modules` checks it). A family's
    own `arch` is any frozen dataclass its launcher side and trainer read; the launcher reads `parameters` (an int:
    the checkpoint's size) off one not trained on text."""
    known = REGISTRY.get(entry.name)
    if known == entry:  # the same module imported again
        return entry
    if known is not None:
        raise ValueError(f"model {entry.name!r} is in the registry already; give the new one another name")
    REGISTRY[entry.name] = entry
    return entry


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
