"""Build the Llama model: from a config (random init, no download) or from pretrained weights."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

DECODER_LAYER = "LlamaDecoderLayer"


def build_model(model_config: str | None, weights: str | None, seed: int) -> LlamaForCausalLM:
    if weights is not None:
        # HF_TOKEN comes from the environment (a Kubernetes Secret on EKS), never from the command line.
        model = AutoModelForCausalLM.from_pretrained(weights, token=os.environ.get("HF_TOKEN"), dtype=torch.float32)
    else:
        config = LlamaConfig(**json.loads(Path(model_config).read_text()))
        torch.manual_seed(seed)  # every rank builds identical weights before sharding
        model = LlamaForCausalLM(config)
    model.config.use_cache = False
    return model


def consolidated_copy(config: LlamaConfig, state_dict: dict[str, torch.Tensor]) -> LlamaForCausalLM:
    """A plain (unsharded) model holding a full state dict, for `save_pretrained`."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(state_dict, assign=True)
    return model
