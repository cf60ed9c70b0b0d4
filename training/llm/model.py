"""Build the Llama model: from a config (random init, no download) or from pretrained weights."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

DECODER_LAYER = "LlamaDecoderLayer"


def build_model(model_config: str | None, weights: str | None, seed: int, materialize: bool = True) -> LlamaForCausalLM:
    """The model in fp32. `materialize=False` (every FSDP rank but 0): the right shapes in memory that is
    allocated but never written, so untouched; Accelerate's `cpu_ram_efficient_loading` then broadcasts rank
    0's weights into each rank's shards. Only one process of the job ever holds the whole model (70B in
    fp32 is 280 GB: eight ranks each building it would need 2.2 TB on a p5 node)."""
    if not materialize:
        return _shapes_only(_config(model_config, weights))
    if weights is not None:
        # HF_TOKEN comes from the environment (a Kubernetes Secret on EKS), never from the command line.
        model = AutoModelForCausalLM.from_pretrained(weights, token=os.environ.get("HF_TOKEN"), dtype=torch.float32)
    else:
        config = LlamaConfig(**json.loads(Path(model_config).read_text()))
        torch.manual_seed(seed)  # the same weights wherever they are built (rank 0 under FSDP, every DDP rank)
        model = LlamaForCausalLM(config)
    model.config.use_cache = False
    return model


def _config(model_config: str | None, weights: str | None) -> LlamaConfig:
    if weights is not None:
        return LlamaConfig.from_pretrained(weights, token=os.environ.get("HF_TOKEN"))
    return LlamaConfig(**json.loads(Path(model_config).read_text()))


def _shapes_only(config: LlamaConfig) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # Real, distinct storage (Accelerate maps optimizer parameters to shards by address), left unwritten.
    model.to_empty(device="cpu")
    # The rotary frequencies are computed, not loaded: no broadcast brings them, so compute them here.
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    model.config.use_cache = False
    return model


def consolidated_copy(config: LlamaConfig, state_dict: dict[str, torch.Tensor]) -> LlamaForCausalLM:
    """A plain (unsharded) model holding a full state dict, for `save_pretrained`."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(state_dict, assign=True)
    return model
