"""The model registry: name -> architecture, default recipe and where pretrained weights live.

Llama 2 shapes are the published ones (Touvron et al. 2023, table 1 and the Hugging Face
`config.json` of each `meta-llama/Llama-2-*-hf` repository): vocabulary 32,000, context 4,096,
grouped-query attention with 8 KV heads for 70B only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from training.common.flops import TransformerShape

from .errors import SpecError


@dataclass(frozen=True)
class LlamaArch:
    """A Llama 2 architecture, in the field names of `transformers.LlamaConfig`."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int = 32000
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5

    def truncated(self, layers: int | None) -> LlamaArch:
        """The same layer shapes with fewer layers (for benchmarks and tests)."""
        if layers is None:
            return self
        return replace(self, num_hidden_layers=layers)

    def shape(self) -> TransformerShape:
        return TransformerShape.from_hf_config(self)

    def hf_config(self) -> dict:
        """A `config.json` body that `transformers.LlamaConfig` / `AutoConfig` accept."""
        return {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "rope_theta": 10000.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        }


@dataclass(frozen=True)
class Recipe:
    """Defaults a model brings to the job spec; flags and profiles override them."""

    steps: int
    global_batch_size: int
    micro_batch_size: int
    seq_len: int
    lr: float
    warmup_steps: int
    checkpoint_interval: int
    activation_checkpointing: bool
    cpu_batch: tuple[int, int] | None = None
    """(global, micro) batch used instead on a machine without GPUs, when no batch flag is given."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    family: str
    arch: LlamaArch
    recipe: Recipe
    hub_id: str | None = None
    notes: str = field(default="")


def _finetune_recipe(micro_batch_size: int) -> Recipe:
    """Full fine-tuning of a pretrained Llama 2 at its native context."""
    return Recipe(
        steps=1000,
        global_batch_size=64,
        micro_batch_size=micro_batch_size,
        seq_len=4096,
        lr=2e-5,
        warmup_steps=30,
        checkpoint_interval=200,
        activation_checkpointing=True,
        # A 7B-shaped layer stack runs ~10 s per 256 tokens on two CPU cores: keep CPU smoke runs short.
        cpu_batch=(2, 1),
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
        cpu_batch=None,  # already sized for CPU
    )


REGISTRY: dict[str, ModelEntry] = {
    "llama2-7b": ModelEntry(
        name="llama2-7b",
        family="llama",
        arch=LlamaArch(4096, 32, 32, 32, 11008),
        recipe=_finetune_recipe(micro_batch_size=4),
        hub_id="meta-llama/Llama-2-7b-hf",
    ),
    "llama2-13b": ModelEntry(
        name="llama2-13b",
        family="llama",
        arch=LlamaArch(5120, 40, 40, 40, 13824),
        recipe=_finetune_recipe(micro_batch_size=2),
        hub_id="meta-llama/Llama-2-13b-hf",
    ),
    "llama2-70b": ModelEntry(
        name="llama2-70b",
        family="llama",
        arch=LlamaArch(8192, 80, 64, 8, 28672),
        recipe=_finetune_recipe(micro_batch_size=1),
        hub_id="meta-llama/Llama-2-70b-hf",
    ),
    "llama2-tiny": ModelEntry(
        name="llama2-tiny",
        family="llama",
        # Llama 2 architecture (RMSNorm, SwiGLU, RoPE, grouped-query attention) at ~3.2M parameters,
        # with a 512-entry vocabulary that fits the byte tokenizer.
        arch=LlamaArch(256, 4, 4, 2, 688, vocab_size=512, max_position_embeddings=512),
        recipe=_tiny_recipe(),
        notes="debug model; random init only unless --weights points at a local checkpoint",
    ),
}


def get_model(name: str) -> ModelEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise SpecError(f"--model {name!r} is not a known model; choose one of: {', '.join(REGISTRY)}") from None
