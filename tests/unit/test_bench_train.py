"""The bench's arithmetic: which steps count, the step-time parts, MFU against both peaks, the ratio."""

from __future__ import annotations

import re

import pytest

from training.vision.launch import flops_per_image
from trainkit.bench import record as bench_record
from trainkit.bench import train as benchtrain
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
    summary = bench_record.summarise(steps(20), 4, 1e9, {"datasheet": 100.0, "measured": 50.0}, 123)
    assert summary["steps_timed"] == 18  # the first tenth, two steps, is warm-up
    assert summary["tokens_per_s"] == 100.0 and summary["tokens_per_s_per_device"] == 25.0
    assert summary["breakdown_s"] == {
        "input_wait": 0.25,
        "forward_backward": 1.25,
        "optimizer": 0.5,
        "exposed_communication": None,  # not profiled
    }
    assert summary["mfu_datasheet"] == pytest.approx(100.0 * 1e9 / (4 * 100e12))
    assert summary["mfu_measured"] == pytest.approx(2 * summary["mfu_datasheet"])
    assert (summary["first_loss"], summary["peak_memory_bytes"]) == (5.0, 123)
    # by the wall clock: 200 tokens a step, one step every 2.5 s
    assert summary["tokens_per_s_wall"] == pytest.approx(80.0)


def test_profiled_steps_after_warm_up_are_left_out_and_their_figures_kept():
    records = steps(20)
    window = bench_record.profile_window(20)
    assert window == "3:4"  # the two steps after the two warm-up steps
    for record in records[2:4]:
        record["profiled"], record["tokens_per_s"] = True, 1.0  # slowed by the profiler
    profile = {"steps": [3, 4], "communication_s": 0.4, "exposed_communication_s": 0.1}
    summary = bench_record.summarise(records, 4, 1e9, {"datasheet": None, "measured": None}, 1, profile=profile)
    assert summary["steps_timed"] == 16 and summary["tokens_per_s"] == 100.0
    assert (summary["communication_s"], summary["breakdown_s"]["exposed_communication"]) == (0.4, 0.1)
    assert summary["tokens_per_s_wall"] == pytest.approx(80.0)  # the wall clock starts after the profiled steps


def test_exposed_communication_is_what_no_compute_covers():
    from training.common import profiling

    comm = [(0.0, 1.0), (0.5, 2.0), (5.0, 6.0)]  # overlapping collectives count once: 3 s
    compute = [(0.0, 0.5), (1.5, 5.5)]
    assert profiling.union(comm) == [(0.0, 2.0), (5.0, 6.0)]
    assert profiling.exposed(comm, compute) == pytest.approx((3.0, 1.5))  # 0.5-1.5 and 5.5-6.0 under nothing
    assert profiling.exposed(comm, []) == pytest.approx((3.0, 3.0))
    assert profiling.exposed([], compute) == (0.0, 0.0)
    for bad in ("two", "3:2", "0:1"):
        with pytest.raises(ValueError, match="FIRST:LAST"):
            profiling.StepProfile(bad)


@pytest.mark.parametrize(("start", "profiled"), [(0, [2, 3]), (2, [])])  # a fresh run; one resumed inside the window
def test_only_steps_that_ran_under_the_profiler_are_flagged(start, profiled):
    import torch

    from training.common import profiling

    profile = profiling.StepProfile("2:3")
    for step in range(start, 4):
        profile.before(step + 1)
        torch.ones(8) @ torch.ones(8)
        profile.after(step + 1)
    assert [step for step in range(1, 5) if profile.profiled(step)] == profiled
    assert (profile.report or {}).get("steps") == ([2, 3] if profiled else None)
    assert not profiling.StepProfile("").profiled(1)


def test_too_few_steps_to_time_are_refused():
    with pytest.raises(SpecError, match="raise --steps"):
        bench_record.steady(steps(1))


def test_the_ratio_is_trainkit_over_reference_per_pair():
    spec = {
        "version": 2,  # spec.json's
        "model": {"name": "m", "family": "decoder"},
        "data": {"seq_len": 128},
        "optimisation": {"global_batch_size": 8, "micro_batch_size": 4, "steps": 10},
        "parallelism": {"nodes": 1, "nproc": 2, "sharding": "FULL_SHARD"},
    }
    config = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
    }
    config |= {"intermediate_size": 128, "vocab_size": 256}
    env = {"device": {"name": "cpu", "count": 1, "kind": "cpu"}, "versions": {}}
    ours = [{"tokens_per_s": 90.0, "tokens_per_s_wall": 80.0}, {"tokens_per_s": 110.0, "tokens_per_s_wall": 100.0}]
    theirs = [{"tokens_per_s": 100.0, "tokens_per_s_wall": 100.0}, {"tokens_per_s": 100.0, "tokens_per_s_wall": 100.0}]
    record = bench_record.make_record(
        [], env, {"datasheet": None, "measured": None}, spec, config, "fp32", ours, theirs
    )
    assert record["ratio"] == {"pairs": [0.9, 1.1], "median": 1.0, "min": 0.9, "max": 1.1}
    assert record["ratio_wall"] == {"pairs": [0.8, 1.0], "median": 0.9, "min": 0.8, "max": 1.0}
    assert record["job"]["processes"] == 2 and record["job"]["layers"] == 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model", "resnet-tiny", "--sharding", "FULL_SHARD"], "trains data-parallel (NO_SHARD)"),
        (["--model", "resnet-tiny", "--synthetic"], "runs both inputs itself"),
        (["--activation-checkpointing", "--sharding", "NO_SHARD"], "FSDP2 (FULL_SHARD or SHARD_GRAD_OP)"),
        (["--model", "bert-tiny"], "has references for decoder and vision models, none yet for BERT"),
    ],
)
def test_what_the_reference_cannot_run_is_refused_before_any_run(flags, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        benchtrain.precheck(flags)
    assert benchtrain.precheck(["--model", "llama2-tiny", "--activation-checkpointing"]) == "decoder"
    assert benchtrain.precheck(["--model", "resnet-tiny"]) == "vision"


def test_a_vision_record_has_images_per_s_the_reference_ratio_and_the_input_pipelines_share():
    records = [{**step, "samples_per_s": step["tokens_per_s"] / 10} for step in steps(20)]
    summary = bench_record.summarise(records, 2, 1e8, {"datasheet": None, "measured": None}, 1, "vision")
    assert summary["images_per_s"] == 10.0 and summary["images_per_s_per_device"] == 5.0
    assert summary["images_per_s_wall"] == pytest.approx(8.0) and summary["mfu_datasheet"] is None
    spec = {
        "version": 2,  # spec.json's
        "model": {"name": "resnet-tiny", "family": "vision"},
        "data": {"image_size": 32, "loader_workers": 1},
        "optimisation": {"global_batch_size": 40, "micro_batch_size": 20, "steps": 12},
        "parallelism": {"nodes": 1, "nproc": 2, "sharding": "NO_SHARD"},
    }
    env = {"device": {"name": "cpu", "count": 1, "kind": "cpu"}, "versions": {}}
    ours = [{"images_per_s": 90.0, "images_per_s_wall": 50.0}, {"images_per_s": 120.0, "images_per_s_wall": 60.0}]
    theirs = [{"images_per_s": 100.0, "images_per_s_wall": 100.0}, {"images_per_s": 100.0, "images_per_s_wall": 80.0}]
    ceiling = [{"images_per_s": 100.0}, {"images_per_s": 150.0}]
    peaks = {"datasheet": None, "measured": None}
    record = bench_record.make_record([], env, peaks, spec, {"num_classes": 10}, "fp32", ours, theirs, ceiling)
    assert record["ratio"] == {"pairs": [0.9, 1.2], "median": 1.05, "min": 0.9, "max": 1.2}
    assert record["input_pipeline"]["pairs"] == [0.9, 0.8] and record["synthetic_input"] == ceiling
    assert record["job"]["image_size"] == 32 and record["job"]["flops_per_image"] == pytest.approx(104_036_352)
    assert "DDP loop of training/bench/vision_reference.py" in record["what"]


def test_training_flops_per_image_are_three_times_torchvisions_published_forward_count():
    # torchvision's ResNet50_Weights.IMAGENET1K_V1 meta: 4.089 GFLOPS (multiply-adds) per 224 x 224 image forward
    flops = flops_per_image("resnet50", 1000, 224)
    assert flops == pytest.approx(3 * 2 * 4.089e9, rel=0.01)


def test_the_vision_benchs_on_device_run_leaves_the_data_and_loader_flags_out():
    """--synthetic reads no data and has no loader, so its run drops the dataset and the loader's settings (they
    would be refused) and keeps the rest."""
    flags = ["--model", "resnet-tiny", "--prefetch-factor", "2", "--steps", "6", "--pin-memory", "false"]
    flags += ["--dataset", "/data/imagenet"]
    assert benchtrain.without(flags, benchtrain.NOT_ON_DEVICE) == ["--model", "resnet-tiny", "--steps", "6"]
