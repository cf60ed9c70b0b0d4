"""What trainkit knows of decoder-only causal LMs beyond the registry's names: for each Hugging Face `model_type` it
trains, how its layers differ from Llama's (`DECODER_TYPES`), why another is refused (`decoder_refusal`), and the
architecture read from a `config.json` (`DecoderArch`), whose exact parameter count and FLOPs the planner and MFU
use. Torch-free, as the registry that holds the Llama 2 shapes as `DecoderArch`es."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from training.common.flops import TransformerShape


@dataclass(frozen=True)
class DecoderType:
    """How one `model_type` of transformers 5.23 differs from Llama in its parameters (its `modeling_<type>.py`),
    and the defaults its config class (`configuration_<type>.py`) gives the fields that size it when a
    `config.json` leaves them out."""

    defaults: dict
    qkv_bias: bool | None = None
    """Biases on q, k and v: True always (Qwen2), False never, None: as the config's `attention_bias`."""
    o_bias: bool | None = None
    """A bias on o: False never, None: as the config's `attention_bias`."""
    mlp_bias: bool = False
    """Whether the config's `mlp_bias` puts biases on the MLP's matrices (Llama only)."""
    qk_norm: bool = False
    norms_per_layer: int = 2
    sliding: str = "none"
    """Which layers attend through `sliding_window`: `none`; `all` (Mistral); `qwen` (with `use_sliding_window`,
    the layers from `max_window_layers` on); `pattern` (Gemma 3: all but every 6th). `layer_types`, when the
    config lists them, says it per layer instead."""
    refused: tuple[tuple[str, str], ...] = ()
    """(field, why): a config that sets one of them is refused."""


DECODER_TYPES: dict[str, DecoderType] = {
    # Llama 2 and 3 (Llama 3 is the same class with grouped-query attention and rope_theta 500,000).
    "llama": DecoderType(
        {
            "num_key_value_heads": None,
            "head_dim": None,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "max_position_embeddings": 2048,
        },
        mlp_bias=True,
    ),
    "mistral": DecoderType(
        {
            "num_key_value_heads": 8,
            "head_dim": None,
            "tie_word_embeddings": False,
            "max_position_embeddings": 131072,
            "sliding_window": 4096,
        },
        qkv_bias=False,
        o_bias=False,
        sliding="all",
    ),
    "qwen2": DecoderType(
        {
            "num_key_value_heads": 32,
            "head_dim": None,
            "tie_word_embeddings": False,
            "max_position_embeddings": 32768,
            "sliding_window": 4096,
        },
        qkv_bias=True,
        o_bias=False,
        sliding="qwen",
    ),
    "qwen3": DecoderType(
        {
            "num_key_value_heads": 32,
            "head_dim": 128,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "max_position_embeddings": 32768,
            "sliding_window": 4096,
        },
        qk_norm=True,
        sliding="qwen",
    ),
    "gemma": DecoderType(
        {
            "num_key_value_heads": 16,
            "head_dim": 256,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "max_position_embeddings": 8192,
        },
    ),
    # Gemma 3's text model: a norm after attention and after the MLP besides Gemma's two, q and k norms, local
    # (sliding) layers between global ones.
    "gemma3_text": DecoderType(
        {
            "num_key_value_heads": 4,
            "head_dim": 256,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "max_position_embeddings": 131072,
            "sliding_window": 4096,
        },
        qk_norm=True,
        norms_per_layer=4,
        sliding="pattern",
        refused=(
            ("attn_logit_softcapping", "PyTorch's sdpa attention cannot soft-cap attention logits"),
            ("use_bidirectional_attention", "its attention is bidirectional, not a causal language model's"),
        ),
    ),
}
"""The decoders trainkit sizes exactly (`DecoderArch.parameters()` is the built model's count) and trains."""

UNSIZED = {
    "gemma2": "its attention soft-capping runs only in eager attention (transformers 5.23: Gemma2 has no sdpa path)",
}
"""Causal LMs transformers ships that trainkit refuses, and why."""
EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
"""Config fields of mixture-of-experts models (Mixtral, Qwen MoE, DeepSeek ...): the dense formulas do not size them."""
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def decoder_refusal(config: dict) -> str | None:
    """Why trainkit cannot size and train the causal LM a Hugging Face config describes, or None when it can."""
    model_type = config.get("model_type")
    supported = f"trainkit sizes and trains these model types: {', '.join(DECODER_TYPES)}"
    if not model_type:
        return f"the config has no model_type; {supported}"
    architectures = config.get("architectures") or []
    causal = [a for a in architectures if a.endswith(("ForCausalLM", "LMHeadModel"))]
    experts = [f"{key}={config[key]}" for key in EXPERTS if config.get(key)]
    if architectures and not causal:
        why = f"not a text-only causal language model (architectures: {', '.join(architectures)})"
    elif experts:
        why = f"a mixture-of-experts model ({', '.join(experts)}); the parameter and FLOPs formulas are for dense ones"
    elif model_type in UNSIZED:
        why = UNSIZED[model_type]
    elif model_type not in DECODER_TYPES:
        why = "no parameter formula for its layers (which matrices, biases and norms they hold)"
    elif config.get("quantization_config"):
        why = "quantized weights (quantization_config): trainkit trains full-precision ones; give the unquantized model"
    else:
        missing = [key for key in REQUIRED if config.get(key) is None]
        refused = [f"{key} ({reason})" for key, reason in DECODER_TYPES[model_type].refused if config.get(key)]
        if not (missing or refused):
            return None
        why = f"the config lacks {', '.join(missing)}" if missing else f"it sets {'; '.join(refused)}"
    return f"model_type {model_type!r}: {why}; {supported}"


@dataclass(frozen=True)
class DecoderArch:
    """A decoder-only causal LM, in the field names of its Hugging Face config (`model_type` one of DECODER_TYPES).
    The registry's Llama 2 shapes are written out; any other comes from a `config.json` (`from_config`), which it
    keeps to give back (`hf_config`)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int = 32000
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    model_type: str = "llama"
    head_dim: int | None = None
    """None: hidden_size / num_attention_heads."""
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    """Per layer, `sliding_attention` (through the window) or `full_attention`; None: all full."""
    config: dict | None = field(default=None, compare=False, repr=False)
    """The config this was read from, if any."""

    @classmethod
    def from_config(cls, config: dict) -> DecoderArch:
        """The architecture a Hugging Face `config.json` describes; one trainkit cannot size exactly is a
        ValueError that says why (`decoder_refusal`)."""
        refusal = decoder_refusal(config)
        if refusal:
            raise ValueError(refusal)
        kind = DECODER_TYPES[config["model_type"]]
        value = {**kind.defaults, **config}.get
        layers = config["num_hidden_layers"]
        window = value("sliding_window") if kind.sliding != "none" else None
        if kind.sliding == "qwen" and not config.get("use_sliding_window"):
            window = None
        return cls(
            hidden_size=config["hidden_size"],
            num_hidden_layers=layers,
            num_attention_heads=config["num_attention_heads"],
            num_key_value_heads=value("num_key_value_heads") or config["num_attention_heads"],
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            max_position_embeddings=value("max_position_embeddings"),
            rms_norm_eps=value("rms_norm_eps", 1e-6),
            model_type=config["model_type"],
            head_dim=value("head_dim"),
            tie_word_embeddings=bool(value("tie_word_embeddings")),
            attention_bias=bool(value("attention_bias", False)),
            mlp_bias=kind.mlp_bias and bool(value("mlp_bias", False)),
            sliding_window=window,
            layer_types=_layer_types(kind, config, layers, window),
            config=dict(config),
        )

    def truncated(self, layers: int | None) -> DecoderArch:
        """The same layer shapes with fewer layers (for benchmarks and tests)."""
        if layers is None:
            return self
        kept = None if self.layer_types is None else self.layer_types[:layers]
        return replace(self, num_hidden_layers=layers, layer_types=kept)

    def shape(self) -> TransformerShape:
        kind = DECODER_TYPES[self.model_type]
        sliding = sum(t == "sliding_attention" for t in self.layer_types or ()) if self.sliding_window else 0
        return TransformerShape(
            layers=self.num_hidden_layers,
            hidden=self.hidden_size,
            heads=self.num_attention_heads,
            kv_heads=self.num_key_value_heads,
            ffn=self.intermediate_size,
            vocab=self.vocab_size,
            head_dim=self.head_dim,
            qkv_bias=self.attention_bias if kind.qkv_bias is None else kind.qkv_bias,
            o_bias=self.attention_bias if kind.o_bias is None else kind.o_bias,
            mlp_bias=self.mlp_bias,
            qk_norm=kind.qk_norm,
            norms_per_layer=kind.norms_per_layer,
            tied=self.tie_word_embeddings,
            window=self.sliding_window,
            sliding_layers=sliding,
        )

    def parameters(self) -> int:
        """The model's count, as `AutoModelForCausalLM` builds it from `hf_config()` (tests/unit/test_decoders.py)."""
        return self.shape().param_count()

    def hf_config(self) -> dict:
        """A `config.json` body that `AutoConfig` accepts: the one read (with this many layers), or Llama 2's."""
        if self.config is not None:
            config = {**self.config, "num_hidden_layers": self.num_hidden_layers}
            if isinstance(self.config.get("layer_types"), list):
                config["layer_types"] = self.config["layer_types"][: self.num_hidden_layers]
            return config
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


def _layer_types(kind: DecoderType, config: dict, layers: int, window: int | None) -> tuple[str, ...] | None:
    """Which layers attend through the window, as transformers 5.23's config classes work it out."""
    if window is None:
        return None
    if isinstance(config.get("layer_types"), list):
        return tuple(config["layer_types"])
    if kind.sliding == "all":
        return ("sliding_attention",) * layers
    if kind.sliding == "qwen":
        first = config.get("max_window_layers", 28)
        return tuple("sliding_attention" if i >= first else "full_attention" for i in range(layers))
    every = config.get("sliding_window_pattern", 6)
    return tuple("sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers))
