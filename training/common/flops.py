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
    """What the FLOPs formula needs to know about a decoder-only transformer."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    gated: bool = True
    """A gated MLP (SwiGLU: gate, up, down) as in Llama; False: BERT's two matrices (up, down) around GELU."""

    @classmethod
    def from_hf_config(cls, config) -> TransformerShape:
        """From anything with `transformers.LlamaConfig` attribute names (a config or the registry's arch)."""
        return cls(
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            ffn=config.intermediate_size,
            vocab=config.vocab_size,
        )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def params_per_layer(self) -> int:
        kv = self.kv_heads * self.head_dim
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * kv  # q, o, k, v (no biases)
        mlp = (3 if self.gated else 2) * self.hidden * self.ffn  # gate, up, down (SwiGLU); or up, down
        norms = 2 * self.hidden  # RMSNorm before attention and before MLP
        return attention + mlp + norms

    def param_count(self) -> int:
        """All parameters, with untied input embedding and LM head as in Llama 2."""
        return self.layers * self.params_per_layer() + 2 * self.vocab * self.hidden + self.hidden

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward = 3x forward), without recomputation.

        Dense matmuls: 6 FLOPs per parameter per token for every weight a token passes through
        (all layers plus the LM head; the embedding is a lookup, not a matmul). Attention scores
        and the weighted sum add 12 * layers * hidden * seq_len per token (the "6N + 12LHS" form of
        PaLM, Chowdhery et al. 2022, appendix B). Activation recomputation is deliberately not
        counted: MFU measures useful model FLOPs, not hardware FLOPs.
        """
        matmul_params = self.layers * self.params_per_layer() + self.vocab * self.hidden
        return 6.0 * matmul_params + 12.0 * self.layers * self.hidden * seq_len


def mfu(tokens_per_second: float, flops_per_token: float, world_size: int, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak of all participating devices."""
    return tokens_per_second * flops_per_token / (world_size * peak_tflops * 1e12)
