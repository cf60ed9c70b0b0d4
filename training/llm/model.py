"""Build any Hugging Face causal LM trainkit sizes (training/decoders.py `DECODER_TYPES`): from a config (random
init, no download) or from pretrained weights, as the `AutoModelForCausalLM` class its model_type maps to."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def build_model(model_config: str | None, weights: str | None, seed: int, materialize: bool = True) -> PreTrainedModel:
    """The model in fp32. `materialize=False` (every FSDP rank but 0): the right shapes in memory that is
    allocated but never written, so untouched; Accelerate's `cpu_ram_efficient_loading` then broadcasts rank
    0's weights into each rank's shards. Only one process of the job ever holds the whole model (70B in
    fp32 is 280 GB: eight ranks each building it would need 2.2 TB on a p5 node)."""
    if not materialize:
        return _shapes_only(load_config(model_config, weights))
    if weights is not None:
        # HF_TOKEN comes from the environment (a Kubernetes Secret on EKS), never from the command line.
        model = AutoModelForCausalLM.from_pretrained(weights, token=os.environ.get("HF_TOKEN"), dtype=torch.float32)
    else:
        torch.manual_seed(seed)  # the same weights wherever they are built (rank 0 under FSDP, every DDP rank)
        model = AutoModelForCausalLM.from_config(load_config(model_config, None), dtype=torch.float32)
    model.config.use_cache = False
    return model


def load_config(model_config: str | None, weights: str | None) -> PretrainedConfig:
    """The config a job's model is built from: the pretrained weights' own, else the run's `config.json`."""
    if weights is not None:
        return AutoConfig.from_pretrained(weights, token=os.environ.get("HF_TOKEN"))
    return AutoConfig.for_model(**json.loads(Path(model_config).read_text()))


def decoder_layer_class(config: PretrainedConfig) -> str:
    """The class name of the model's decoder layer: the unit FSDP shards and activation checkpointing recomputes,
    from the `_no_split_modules` of the class `AutoModelForCausalLM` builds for this config."""
    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type])
    units = list(model_class._no_split_modules or ())
    if len(units) != 1:
        raise ValueError(f"{model_class.__name__} names {units or 'no'} layer classes to keep whole; expected one")
    return units[0]


def _shapes_only(config: PretrainedConfig) -> PreTrainedModel:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Real, distinct storage (Accelerate maps optimizer parameters to shards by address), left unwritten.
    model.to_empty(device="cpu")
    model.tie_weights()  # to_empty gave a tied LM head a tensor of its own: one parameter again, as on rank 0
    # What the state dict holds comes from rank 0; what it does not (rotary frequencies, every rotary embedding's,
    # Gemma's embedding scale: non-persistent buffers) no broadcast brings, so compute it here. transformers'
    # initialisation skips every tensor marked initialised, as its own FSDP loading marks them on ranks > 0.
    for tensor in model.state_dict(keep_vars=True).values():
        tensor._is_hf_initialized = True
    model.initialize_weights()
    model.config.use_cache = False
    return model


def consolidated_copy(config: PretrainedConfig, state_dict: dict[str, torch.Tensor]) -> PreTrainedModel:
    """A plain (unsharded) model holding a full state dict, for `save_pretrained`."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state_dict, assign=True)
    model.tie_weights()  # assigning gave a tied LM head its own tensor: one again, as the config says
    return model
