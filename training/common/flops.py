"""Model FLOPs and accelerator peak throughput: one source for the trainer's MFU and the planner.

Torch-free on purpose: the launcher's planner imports this without pulling in PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass

# Dense (no sparsity) BF16 tensor-core peak per GPU, in TFLOP/s, from NVIDIA's datasheets:
# A100 SXM 312; H100 SXM 989 (the datasheet's 1,979 counts 2:4 sparsity); H200 SXM 989 (same core).
PEAK_BF16_TFLOPS = {
    "A100": 312.0,
    "H100": 989.0,
    "H200": 989.0,
}


def peak_tflops_for_device(device_name: str) -> float | None:
    """Peak dense BF16 TFLOP/s for a device name such as 'NVIDIA H100 80GB HBM3', or None if unknown."""
    upper = device_name.upper()
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in upper:
            return value
    return None


@dataclass(frozen=True)
class TransformerShape:
    """What the FLOPs formula and the planner need to know about a transformer's layer stack: the matrices a token
    passes through (with their biases) and how far each layer attends."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    gated: bool = True
    """A gated MLP (gate, up, down: SwiGLU in Llama, GELU in Gemma); False: BERT's up and down around GELU."""
    head_dim: int | None = None
    """Width of one attention head; None: hidden / heads (Llama 2). Gemma and Qwen3 set it apart."""
    qkv_bias: bool = False
    """Biases on the query, key and value projections (Qwen2; Llama with `attention_bias`)."""
    o_bias: bool = False
    """A bias on the attention's output projection (Llama with `attention_bias`)."""
    mlp_bias: bool = False
    """Biases on the MLP's matrices (Llama with `mlp_bias`)."""
    qk_norm: bool = False
    """An RMSNorm of head_dim on queries and one on keys in every layer (Qwen3, Gemma 3)."""
    norms_per_layer: int = 2
    """Hidden-sized norms per layer: before attention and before the MLP; Gemma 3 adds one after each."""
    tied: bool = False
    """The LM head is the input embedding (one matrix, counted once); Llama 2 keeps them apart."""
    window: int | None = None
    """Tokens a sliding-window layer attends to (Mistral, Qwen with `use_sliding_window`, Gemma 3's local layers)."""
    sliding_layers: int = 0
    """How many of the layers attend through the window; the rest attend to the whole sequence."""

    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    def params_per_layer(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = 2 * self.hidden * q + 2 * self.hidden * kv  # q and o; k and v
        attention += (q + 2 * kv) * self.qkv_bias + self.hidden * self.o_bias + 2 * self.head_dim * self.qk_norm
        matrices = 3 if self.gated else 2  # gate, up, down; or up, down
        mlp = matrices * self.hidden * self.ffn + ((matrices - 1) * self.ffn + self.hidden) * self.mlp_bias
        return attention + mlp + self.norms_per_layer * self.hidden

    def param_count(self) -> int:
        """All parameters: the layers, the final norm, the input embedding and (untied) the LM head."""
        embeddings = (1 if self.tied else 2) * self.vocab * self.hidden
        return self.layers * self.params_per_layer() + embeddings + self.hidden

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of a decoder layer, by the name the registry's decoder types give it."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        found = {"q_proj": (self.hidden, q), "k_proj": (self.hidden, kv), "v_proj": (self.hidden, kv)}
        found |= {"o_proj": (q, self.hidden)} | ({"gate_proj": (self.hidden, self.ffn)} if self.gated else {})
        return found | {"up_proj": (self.hidden, self.ffn), "down_proj": (self.ffn, self.hidden)}

    def adapter_params(self, rank: int, targets: tuple[str, ...] | None = None) -> int:
        """LoRA's parameters over all layers: rank x (in + out) for each targeted linear layer (A: rank x in, B:
        out x rank); `targets` None: every linear layer of a decoder layer."""
        shapes = self.linear_shapes()
        chosen = shapes if targets is None else {name: shapes[name] for name in targets}
        return self.layers * sum(rank * (inputs + outputs) for inputs, outputs in chosen.values())

    def flops_per_token(self, seq_len: int, adapter_params: int | None = None) -> float:
        """Training FLOPs per token (forward + backward = 3x forward), without recomputation.

        Dense matmuls: 6 FLOPs per parameter per token for every weight a token passes through
        (all layers plus the LM head, tied or not; the embedding is a lookup, not a matmul). Attention scores
        and the weighted sum add 12 * layers * (heads * head_dim) * span per token, the span being seq_len, or the
        window in a sliding-window layer when it is shorter (the "6N + 12LHS" form of PaLM, Chowdhery et al. 2022,
        appendix B, where heads * head_dim = hidden). Activation recomputation is deliberately not
        counted: MFU measures useful model FLOPs, not hardware FLOPs.

        Under LoRA (`adapter_params`: the adapters' count) the frozen weights get no weight gradient: 2 FLOPs per
        parameter forward and 2 for the gradient of their input, 4 instead of 6 (a little less in truth: no input
        gradient is needed below the first adapter); the adapters train in full, 6 each. Attention's scores and sum
        hold no weights, so they cost the same either way.
        """
        matmul_params = self.layers * self.params_per_layer() + self.vocab * self.hidden
        window = min(seq_len, self.window or seq_len)
        spans = (self.layers - self.sliding_layers) * seq_len + self.sliding_layers * window
        attention = 12.0 * self.heads * self.head_dim * spans
        if adapter_params is not None:
            return 4.0 * matmul_params + 6.0 * adapter_params + attention
        return 6.0 * matmul_params + attention


def mfu(tokens_per_second: float, flops_per_token: float, world_size: int, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak of all participating devices."""
    return tokens_per_second * flops_per_token / (world_size * peak_tflops * 1e12)
