"""Decoder data: the byte tokenizer, synthetic dialogues and rank sharding (formats and packing: test_text_data.py)."""

from __future__ import annotations

import json

import pytest
import torch

from training.common.sampling import StepSampler
from training.text.dialogues import write_dialogues
from training.text.tokenizer import byte_tokenizer


def test_byte_tokenizer_round_trips_any_text_without_a_download():
    tokenizer = byte_tokenizer()
    text = "Hi Zoë, meet at 7 pm? — ok ✓"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    assert max(ids) < 259


def test_synthetic_dialogues_are_deterministic_and_summaries_follow_from_the_dialogue(tmp_path):
    a = write_dialogues(tmp_path / "a.jsonl", count=50, seed=3).read_text()
    b = write_dialogues(tmp_path / "b.jsonl", count=50, seed=3).read_text()
    assert a == b
    for record in map(json.loads, a.splitlines()):
        first, _and, second = record["summary"].split(" ")[:3]
        assert first in record["dialogue"] and second in record["dialogue"]
        place = record["summary"].split(" at ")[1]
        assert place in record["dialogue"]


def test_ranks_read_disjoint_slices_that_cover_each_step_and_depend_only_on_the_step():
    world, global_batch, micro = 2, 8, 2
    samplers = [StepSampler(40, global_batch, micro, rank, world, seed=7) for rank in range(world)]
    for step in range(12):  # 5 steps per epoch: crosses two epoch boundaries
        parts = [torch.cat(s.micro_batches(step)) for s in samplers]
        assert all(len(p) == global_batch // world for p in parts)
        assert not set(parts[0].tolist()) & set(parts[1].tolist())
    epoch0 = torch.cat([torch.cat(samplers[0].micro_batches(s) + samplers[1].micro_batches(s)) for s in range(5)])
    assert sorted(epoch0.tolist()) == list(range(40))  # every block once per epoch
    fresh = StepSampler(40, global_batch, micro, 1, world, seed=7)  # a resumed process
    assert [t.tolist() for t in fresh.micro_batches(11)] == [t.tolist() for t in samplers[1].micro_batches(11)]


def test_too_little_data_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than one global batch of 16"):
        StepSampler(10, 16, 8, 0, 2, seed=0)
