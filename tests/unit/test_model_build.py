"""How the Llama model is built on each rank: under FSDP only rank 0 writes real weights; the other ranks
hold the shapes in memory they never touch, and receive rank 0's weights, sharded, when Accelerate prepares
the model (tested end to end by every multi-process run comparing its losses with a one-process run)."""

from __future__ import annotations

import json

import torch

from training.llm.model import build_model
from trainkit.job.models import get_model


def rss_bytes() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_ranks_other_than_0_build_the_shapes_without_touching_the_memory(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(get_model("llama2-7b").arch.truncated(2).hf_config()))
    before = rss_bytes()
    model = build_model(str(config), None, seed=0, materialize=False)
    grown = rss_bytes() - before
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    assert size == 4 * (2 * 202_383_360 + 2 * 32000 * 4096 + 4096)  # 2.7 GB of fp32 parameters...
    assert grown < size / 10, (grown, size)  # ...of which almost nothing is resident
    assert all(p.device.type == "cpu" for p in model.parameters())
    addresses = {p.data_ptr() for p in model.parameters()}
    assert len(addresses) == len(list(model.parameters()))  # Accelerate maps optimizer state by address


def test_the_rotary_frequencies_are_computed_on_every_rank(tmp_path):
    """They are not in the state dict, so no broadcast brings them: shapes-only ranks compute them."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(get_model("llama2-tiny").arch.hf_config()))
    real = build_model(str(config), None, seed=0)
    shapes = build_model(str(config), None, seed=0, materialize=False)
    for name in ("inv_freq", "original_inv_freq"):
        assert torch.equal(getattr(real.model.rotary_emb, name), getattr(shapes.model.rotary_emb, name))
    assert real.model.rotary_emb.attention_scaling == shapes.model.rotary_emb.attention_scaling


def test_decoders_decay_their_weight_matrices_but_not_norms_biases_or_token_embeddings(tmp_path):
    """Issue 50: the decoders' AdamW decayed every parameter. With weight decay set, the groups exempt the norm
    gains and the token embeddings (the one parameter a tied head shares with them); every Linear weight decays."""
    from training.common.trainer import parameter_groups

    config = tmp_path / "config.json"
    config.write_text(json.dumps(get_model("llama2-tiny").arch.hf_config()))
    model = build_model(str(config), None, seed=0)
    decay, exempt = parameter_groups(model, 0.1, embeddings=False)
    named = {id(p): name for name, p in model.named_parameters()}
    decayed = {named[id(p)] for p in decay["params"]}
    kept = {named[id(p)] for p in exempt["params"]}
    assert (decay["weight_decay"], exempt["weight_decay"]) == (0.1, 0.0)
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert decayed == linear and "lm_head.weight" in decayed
    assert "model.embed_tokens.weight" in kept and all("norm" in n or "embed" in n for n in kept), kept
    assert len(decayed) + len(kept) == len(list(model.parameters()))
    tied = get_model("llama2-tiny").arch.hf_config() | {"tie_word_embeddings": True}
    config.write_text(json.dumps(tied))
    decay, _ = parameter_groups(build_model(str(config), None, seed=0), 0.1, embeddings=False)
    assert not any(p.shape[0] == tied["vocab_size"] for p in decay["params"])  # the tied head is the embedding
