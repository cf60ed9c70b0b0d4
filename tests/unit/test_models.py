"""Model registry against the published Llama 2 architectures, checked on real transformers models."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trainkit.job.models import REGISTRY

# Published: Touvron et al. 2023 and the meta-llama/Llama-2-*-hf config.json files; parameter counts
# are those the Hugging Face checkpoints report (untied embedding and LM head).
PUBLISHED = {
    "llama2-7b": dict(hidden=4096, layers=32, heads=32, kv=32, ffn=11008, params=6_738_415_616),
    "llama2-13b": dict(hidden=5120, layers=40, heads=40, kv=40, ffn=13824, params=13_015_864_320),
    "llama2-70b": dict(hidden=8192, layers=80, heads=64, kv=8, ffn=28672, params=68_976_648_192),
}


def meta_model(arch) -> LlamaForCausalLM:
    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig(**arch.hf_config()))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_architecture_and_parameter_count(name):
    expected, arch = PUBLISHED[name], REGISTRY[name].arch
    assert (arch.hidden_size, arch.num_hidden_layers, arch.num_attention_heads) == (
        expected["hidden"],
        expected["layers"],
        expected["heads"],
    )
    assert (arch.num_key_value_heads, arch.intermediate_size) == (expected["kv"], expected["ffn"])
    assert (arch.vocab_size, arch.max_position_embeddings) == (32000, 4096)
    # Our formula (used by the planner and MFU) and a real transformers model agree with the published count.
    assert arch.shape().param_count() == expected["params"]
    assert sum(p.numel() for p in meta_model(arch).parameters()) == expected["params"]


def test_llama2_7b_truncated_keeps_true_layer_shapes():
    model = meta_model(REGISTRY["llama2-7b"].arch.truncated(2))
    layer = model.model.layers[0]
    assert len(model.model.layers) == 2
    assert layer.self_attn.q_proj.weight.shape == (4096, 4096)
    assert layer.self_attn.k_proj.weight.shape == (4096, 4096)
    assert layer.mlp.gate_proj.weight.shape == (11008, 4096)
    assert layer.mlp.down_proj.weight.shape == (4096, 11008)
    assert model.lm_head.weight.shape == (32000, 4096)


def test_llama2_70b_uses_grouped_query_attention():
    layer = meta_model(REGISTRY["llama2-70b"].arch.truncated(1)).model.layers[0]
    assert layer.self_attn.k_proj.weight.shape == (8 * 128, 8192)  # 8 KV heads of dim 128


def test_tiny_is_the_same_architecture_at_a_few_million_parameters():
    arch = REGISTRY["llama2-tiny"].arch
    count = sum(p.numel() for p in meta_model(arch).parameters())
    assert 1_000_000 < count < 10_000_000
    assert count == arch.shape().param_count()
    assert arch.num_key_value_heads < arch.num_attention_heads  # exercises GQA like 70B


@pytest.mark.parametrize(
    ("weights", "downloads"),
    [
        ("meta-llama/Llama-2-7b-hf", True),  # a hub id: the workers download it with the token
        ("s3://runs/datasets/base/", False),  # SageMaker's weights channel
        ("/fsx/models/base", False),  # a folder on the volume, by its absolute path
        ("./models/base", False),
        ("base", False),  # one part: no hub id, a folder relative to the volume
    ],
)
def test_only_weights_from_the_hub_need_the_token(weights, downloads):
    from training.spec import Job
    from trainkit.job.models import downloads_weights

    job = Job()
    job.model.init, job.model.weights = "pretrained", weights
    assert downloads_weights(job) is downloads
    job.model.init = "random"
    assert downloads_weights(job) is False
