"""The registry's BERT entries (training/registry.py BertArch): the parameter count the planner and the storage
check use is the built model's, and the FLOPs shape is BERT's (an ungated MLP)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM

from training.registry import REGISTRY, BertArch


@pytest.mark.parametrize("name", [name for name, entry in REGISTRY.items() if entry.family == "bert"])
def test_every_bert_entry_counts_the_parameters_its_built_model_has(name):
    arch = REGISTRY[name].arch
    config = BertConfig(**json.loads(json.dumps(arch.hf_config())))
    with torch.device("meta"):  # shapes only: bert-1.5b in fp32 would take 6 GB
        model = BertForMaskedLM(config)
    assert sum(p.numel() for p in model.parameters()) == arch.parameters()
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight  # tied, once


def test_the_published_shapes_and_their_sizes():
    large, big = REGISTRY["bert-large"].arch, REGISTRY["bert-1.5b"].arch
    assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads) == (24, 1024, 16)
    assert (big.num_hidden_layers, big.hidden_size, big.num_attention_heads) == (48, 1600, 25)
    assert 330e6 < large.parameters() < 340e6  # BERT-Large: 335M with the MLM head
    assert 1.4e9 < big.parameters() < 1.6e9


def test_the_flops_shape_has_berts_two_mlp_matrices():
    arch = BertArch(1024, 24, 16, 4096)
    shape = arch.shape()
    assert not shape.gated and shape.kv_heads == shape.heads == 16
    per_layer_mlp = shape.params_per_layer() - 4 * 1024 * 1024 - 2 * 1024  # attention and norms taken out
    assert per_layer_mlp == 2 * 1024 * 4096
    assert arch.truncated(4).shape().layers == 4 and arch.truncated(None) is arch
