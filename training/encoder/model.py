"""BERT for masked-language-model pretraining, built from the run's `config.json` (random init, nothing
downloaded): Hugging Face's `BertForMaskedLM`, its output matrix tied to the word embeddings."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import BertConfig, BertForMaskedLM

ENCODER_LAYER = "BertLayer"


def build_model(model_config: str, seed: int) -> BertForMaskedLM:
    """The model in fp32, the same weights on every rank (DDP starts from rank 0's anyway)."""
    config = BertConfig(**json.loads(Path(model_config).read_text()))
    torch.manual_seed(seed)
    return BertForMaskedLM(config)
