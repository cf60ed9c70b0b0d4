"""The bench's arithmetic: which steps count, the step-time parts, MFU against both peaks, the ratio."""

from __future__ import annotations

import re

import pytest

from trainkit import benchtrain
from trainkit.errors import SpecError


def steps(count: int) -> list[dict]:
    return [
        {
            "step": i + 1,
            "loss": 5.0 - i * 0.1,
            "tokens_per_s": 100.0 if i else 1.0,
            "step_time_s": 2.0,
            "data_wait_s": 0.25,
            "optimizer_s": 0.5,
            "time": 2.5 * (i + 1),  # 0.5 s between steps that the step timer does not see
        }
        for i in range(count)
    ]


def test_warm_up_steps_are_left_out_and_forward_backward_is_the_rest_of_the_step():
    summary = benchtrain.summarise(steps(20), 4, 1e9, {"datasheet": 100.0, "measured": 50.0}, 123)
    assert summary["steps_timed"] == 18  # the first tenth, two steps, is warm-up
    assert summary["tokens_per_s"] == 100.0 and summary["tokens_per_s_per_device"] == 25.0
    assert summary["breakdown_s"] == {
        "input_wait": 0.25,
        "forward_backward": 1.25,
        "optimizer": 0.5,
        "exposed_communication": None,
    }
    assert summary["mfu_datasheet"] == pytest.approx(100.0 * 1e9 / (4 * 100e12))
    assert summary["mfu_measured"] == pytest.approx(2 * summary["mfu_datasheet"])
    assert (summary["first_loss"], summary["peak_memory_bytes"]) == (5.0, 123)
    # by the wall clock: 200 tokens a step, one step every 2.5 s
    assert summary["tokens_per_s_wall"] == pytest.approx(80.0)


def test_too_few_steps_to_time_are_refused():
    with pytest.raises(SpecError, match="raise --steps"):
        benchtrain.steady(steps(1))


def test_the_ratio_is_trainkit_over_reference_per_pair():
    spec = {
        "model": {"name": "m"},
        "data": {"seq_len": 128},
        "optimisation": {"global_batch_size": 8, "micro_batch_size": 4, "steps": 10},
        "parallelism": {"nodes": 1, "nproc": 2, "sharding": "FULL_SHARD"},
    }
    config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4}
    config |= {"intermediate_size": 128, "vocab_size": 256}
    env = {"device": {"name": "cpu", "count": 1, "kind": "cpu"}, "versions": {}}
    ours = [{"tokens_per_s": 90.0, "tokens_per_s_wall": 80.0}, {"tokens_per_s": 110.0, "tokens_per_s_wall": 100.0}]
    theirs = [{"tokens_per_s": 100.0, "tokens_per_s_wall": 100.0}, {"tokens_per_s": 100.0, "tokens_per_s_wall": 100.0}]
    record = benchtrain.make_record([], env, {"datasheet": None, "measured": None}, spec, config, "fp32", ours, theirs)
    assert record["ratio"] == {"pairs": [0.9, 1.1], "median": 1.0, "min": 0.9, "max": 1.1}
    assert record["ratio_wall"] == {"pairs": [0.8, 1.0], "median": 0.9, "min": 0.8, "max": 1.0}
    assert record["job"]["processes"] == 2 and record["job"]["layers"] == 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model", "resnet-tiny"], "vision is not benched yet"),
        (["--activation-checkpointing", "--sharding", "NO_SHARD"], "FSDP2 (FULL_SHARD or SHARD_GRAD_OP)"),
    ],
)
def test_what_the_reference_cannot_run_is_refused_before_any_run(flags, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        benchtrain.precheck(flags)
    benchtrain.precheck(["--model", "llama2-tiny", "--activation-checkpointing"])  # fine
