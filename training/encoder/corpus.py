"""The text an encoder pretrains on, generated offline, and a tokenizer that needs no download. Reading, tokenising
and packing a corpus is the shared text path's (training/text: `text` records or blank-line separated `.txt`
documents, packed as RoBERTa's FULL-SENTENCES); masks are drawn per batch (training/encoder/masking.py).

Torch-free, so the launcher may generate a corpus without PyTorch.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from training.common.files import publish_text
from training.text.dialogues import DAYS, NAMES, PLACES

TEXT_FIELD = "text"
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BYTE_VOCABULARY = len(SPECIAL_TOKENS) + 256
"""The ids byte_tokenizer gives: the special tokens, then one per byte value."""
"""BERT's special tokens, first in the byte tokenizer's vocabulary (ids 0-4), bytes after them."""


def make_document(rng: random.Random) -> str:
    """A few sentences about one person whose facts repeat, so a masked name, place or day can be read back from
    the rest of the document (something for a small model to learn)."""
    name, place, day = rng.choice(NAMES), rng.choice(PLACES), rng.choice(DAYS)
    friend = rng.choice([other for other in NAMES if other != name])
    sentences = [
        f"{name} works at {place}.",
        f"Every {day} {name} meets {friend} at {place}.",
        f"{friend} says {name} is never late on {day}.",
        f"After {day} at {place}, {name} and {friend} go home.",
    ]
    rng.shuffle(sentences)
    return " ".join(sentences)


def write_corpus(path: Path, documents: int = 2000, seed: int = 0) -> Path:
    """`documents` generated documents as JSONL {"text": ...} (atomically); the same seed gives the same file."""
    rng = random.Random(seed)
    lines = (json.dumps({TEXT_FIELD: make_document(rng)}) + "\n" for _ in range(documents))
    return publish_text(path, "".join(lines))


def byte_tokenizer():
    """BERT's special tokens, then one token per UTF-8 byte (training/text/tokenizer.py builds it): saved with a
    model and loaded back by `AutoTokenizer`, no download."""
    from training.text.tokenizer import byte_tokenizer as bytes_after

    roles = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
    return bytes_after(SPECIAL_TOKENS, **dict(zip(roles, SPECIAL_TOKENS, strict=True)))
