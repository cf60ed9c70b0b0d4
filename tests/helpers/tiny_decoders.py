"""Tiny Hugging Face model folders of each decoder type trainkit trains (training/registry.py `DECODER_TYPES`): the
published architectures' shapes (grouped-query attention, head widths apart from hidden / heads, biases, tied
embeddings, sliding windows) at 64 hidden units and 2 layers, so they train in seconds on CPU. A folder holds a
`config.json` and, when asked, the byte tokenizer (259 ids: `<unk>`=0, `<s>`=1, `</s>`=2, then the bytes): the
vocabulary of 320 holds it, and bos/eos/pad are its ids 1 and 2."""

from __future__ import annotations

import json
from pathlib import Path

COMMON = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 160,
    "vocab_size": 320,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}

TINY: dict[str, dict] = {
    # Llama 2: multi-head attention, rope_theta 10,000 (meta-llama/Llama-2-7b-hf config.json).
    "llama2": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_key_value_heads": 4},
    # Llama 3: grouped-query attention, rope_theta 500,000 (meta-llama/Meta-Llama-3-8B config.json).
    "llama3": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_key_value_heads": 2,
        "rope_theta": 500000.0,
    },
    # Mistral 7B v0.1: GQA and a sliding window, here shorter than the test's sequences.
    "mistral": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "num_key_value_heads": 2,
        "sliding_window": 32,
    },
    # Qwen2.5: biases on q, k and v; the small ones tie the LM head to the embedding (Qwen/Qwen2.5-0.5B).
    "qwen2": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    },
    # Qwen3: q and k norms, a head width set apart from hidden / heads.
    "qwen3": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_key_value_heads": 2, "head_dim": 32},
    # Gemma: a wide head, one KV head (as gemma-2b), tied embeddings (its default), gated GELU.
    "gemma": {
        "model_type": "gemma",
        "architectures": ["GemmaForCausalLM"],
        "num_key_value_heads": 1,
        "head_dim": 32,
        "hidden_act": "gelu_pytorch_tanh",
    },
    # Gemma 3's text model: four norms a layer, q and k norms, a local (sliding) layer and a global one.
    "gemma3_text": {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "num_key_value_heads": 2,
        "head_dim": 32,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"],
    },
}


# Chat templates in the two shapes hub models use (written here, not copied): Llama 3's header / end-of-turn
# layout, and ChatML's (Qwen). Neither marks the assistant's text with {% generation %}, as most hub ones do not.
TEMPLATES = {
    "llama3": (
        "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + "
        "m['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    ),
    "qwen2": (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
}


def tiny_config(kind: str) -> dict:
    return {**COMMON, **TINY[kind]}


def write_tiny(folder: Path, kind: str, tokenizer: bool = False) -> Path:
    """A model folder of `kind` (a key of TINY): config.json, and the byte tokenizer's files with `tokenizer`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(tiny_config(kind), indent=2) + "\n")
    if tokenizer:
        from training.text.tokenizer import byte_tokenizer

        saved = byte_tokenizer()
        saved.chat_template = TEMPLATES.get(kind)  # the others get trainkit's default when they train on chat
        saved.save_pretrained(folder)
    return folder


def write_pretrained(folder: Path, kind: str, seed: int = 0) -> Path:
    """A model folder of `kind` (a key of TINY, or a registry model: its own shape) with weights (random, from `seed`)
    and the byte tokenizer: what `--init pretrained` loads, made here with nothing downloaded."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if kind in TINY:
        write_tiny(folder, kind, tokenizer=True)
        config = tiny_config(kind)
    else:
        from training.registry import REGISTRY
        from training.text.tokenizer import byte_tokenizer

        config = REGISTRY[kind].arch.hf_config()
        byte_tokenizer().save_pretrained(folder)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    model.save_pretrained(folder, safe_serialization=True)
    return folder
