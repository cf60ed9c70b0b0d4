"""Tokenizers: the pretrained model's own, or a byte-level one that needs no download.

The byte tokenizer maps every UTF-8 byte to one token (ids 3..258) after `<unk>`=0, `<s>`=1 and
`</s>`=2, the special ids Llama 2 uses. It is a real `PreTrainedTokenizerFast`, so exported models
ship it and `AutoTokenizer.from_pretrained` loads it back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the launcher reads `tokenizer_source` and the sizes without importing transformers
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

BYTE_TOKENIZER = "byte"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]


def byte_tokenizer(specials: list[str] = SPECIAL_TOKENS, **roles: str) -> PreTrainedTokenizerFast:
    """`specials` first (ids 0..), then one token per byte. `roles` name the special tokens' parts (unk_token,
    pad_token, ...); by default Llama 2's. The BERT corpus builds its own with [PAD], [UNK], [CLS], [SEP], [MASK]."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    roles = roles or {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>"}
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(specials)}
    vocab.update({char: len(specials) + i for i, char in enumerate(alphabet)})
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=roles["unk_token"]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, **roles)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """`byte`, or a hub id / local directory (token from HF_TOKEN in the environment, never argv). A tokenizer
    without a chat template gets trainkit's stated default (training/text/formats.py), so a chat dataset renders
    and the exported model carries the template it was trained with."""
    from transformers import AutoTokenizer

    from training.text.formats import DEFAULT_CHAT_TEMPLATE

    if source == BYTE_TOKENIZER:
        tokenizer = byte_tokenizer()
    else:
        tokenizer = AutoTokenizer.from_pretrained(source, token=os.environ.get("HF_TOKEN"))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    return tokenizer


def tokenizer_size(source: str) -> int:
    """How many ids a tokenizer gives (the byte tokenizer's, or a local folder's), for the launcher's check against
    the model's vocabulary. A folder's tokenizer.json is read by `tokenizers` alone (what a fast tokenizer's
    `len()` counts: its vocabulary with the added tokens), without importing transformers and torch; a folder with
    only a slow tokenizer's files is loaded whole."""
    if source == BYTE_TOKENIZER:
        return len(SPECIAL_TOKENS) + 256
    serialized = Path(source).expanduser() / "tokenizer.json"
    if serialized.is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(serialized)).get_vocab_size(with_added_tokens=True)
    return len(load_tokenizer(source))


def job_tokenizer_source(job) -> str:
    """`tokenizer_source` of a decoder job (a registry model is known by its name)."""
    from training.registry import REGISTRY
    from training.spec import weights_path

    model = job.model
    return tokenizer_source(model.name, model.init, weights_path(job), model.name in REGISTRY)


def tokenizer_source(model: str, init: str, weights: str | None, registry_name: bool) -> str:
    """Where a decoder job's tokenizer comes from: the pretrained weights' own; else the model folder's (or the
    folder of a config.json) when it holds one, a hub id's; a registry model built from its config: `byte` (no
    download)."""
    if init == "pretrained" and weights:
        return weights
    if registry_name:
        return BYTE_TOKENIZER
    path = Path(model).expanduser()
    folder = path.parent if path.is_file() else path
    if folder.is_dir():
        return str(folder) if any((folder / name).is_file() for name in TOKENIZER_FILES) else BYTE_TOKENIZER
    return model  # a hub id: its tokenizer


def vocabulary_problem(tokenizer_size: int, vocab_size: int, source: str) -> str | None:
    """Why a model cannot take a tokenizer's ids (one past its embedding would fail mid-step), or None."""
    if tokenizer_size <= vocab_size:
        return None
    what = "the byte tokenizer (no download)" if source == BYTE_TOKENIZER else f"the tokenizer of {source}"
    return (
        f"{what} has {tokenizer_size} tokens and the model's vocabulary {vocab_size}: ids past it would index past "
        f"the embedding; give a config with vocab_size >= {tokenizer_size}, or a model folder holding its own tokenizer"
    )
