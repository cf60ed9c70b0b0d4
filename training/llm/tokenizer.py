"""Tokenizers: the pretrained model's own, or a byte-level one that needs no download.

The byte tokenizer maps every UTF-8 byte to one token (ids 3..258) after `<unk>`=0, `<s>`=1 and
`</s>`=2, the special ids Llama 2 uses. It is a real `PreTrainedTokenizerFast`, so exported models
ship it and `AutoTokenizer.from_pretrained` loads it back.
"""

from __future__ import annotations

import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

BYTE_TOKENIZER = "byte"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]


def byte_tokenizer(specials: list[str] = SPECIAL_TOKENS, **roles: str) -> PreTrainedTokenizerFast:
    """`specials` first (ids 0..), then one token per byte. `roles` name the special tokens' parts (unk_token,
    pad_token, ...); by default Llama 2's. The BERT corpus builds its own with [PAD], [UNK], [CLS], [SEP], [MASK]."""
    roles = roles or {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>"}
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(specials)}
    vocab.update({char: len(specials) + i for i, char in enumerate(alphabet)})
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=roles["unk_token"]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, **roles)


def load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """`byte`, or a hub id / local directory (token from HF_TOKEN in the environment, never argv)."""
    if source == BYTE_TOKENIZER:
        return byte_tokenizer()
    tokenizer = AutoTokenizer.from_pretrained(source, token=os.environ.get("HF_TOKEN"))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
