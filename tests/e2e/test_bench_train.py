"""`invoke bench train`: trainkit's job and the bare FSDP2 reference really run on the same run folder, and the
results file holds both sides' own measurements and their ratio. No speed is asserted (that is the bench's
output, not a test's)."""

from __future__ import annotations

import json
import math

import pytest


def exposed_and_total(ours: dict, reference: dict) -> None:
    """trainkit's side was profiled: collectives ran, and what of them no compute hid is at most all of them; the
    reference was not."""
    communication, exposed = ours["communication_s"], ours["breakdown_s"]["exposed_communication"]
    assert communication > 0 and 0 <= exposed <= communication + 1e-9, ours
    assert reference["communication_s"] is None and reference["breakdown_s"]["exposed_communication"] is None


def test_one_pair_on_cpu_writes_both_sides_and_their_ratio(train_bench_pair):
    """`invoke bench train --model llama2-tiny --steps 6 --repeats 1`, run in the background from early in the
    session (tests/helpers/train_bench.py)."""
    result, folder = train_bench_pair
    output, workdir = folder / "bench.json", folder / "runs"
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads(output.read_text())
    assert record["device"]["kind"] == "cpu" and record["versions"]["torch"].startswith("2.")
    assert record["job"]["model"] == "llama2-tiny" and record["job"]["processes"] == 2
    assert record["peak_tflops"] == {"datasheet_bf16": None, "measured_bf16_matmul": None}  # CPU: no GPU peaks
    (ours,), (theirs,) = record["trainkit"], record["reference"]
    # the first step is warm-up; trainkit's steps 2 and 3 ran under torch.profiler and are not timed either
    assert (ours["steps_timed"], theirs["steps_timed"]) == (3, 5)
    for side in (ours, theirs):
        assert side["tokens_per_s"] > 0 and side["peak_memory_bytes"] > 0
        parts = side["breakdown_s"]
        assert parts["forward_backward"] > 0 and parts["optimizer"] > 0 and parts["input_wait"] >= 0
        assert math.isfinite(side["first_loss"]) and side["last_loss"] < side["first_loss"]  # both really trained
    exposed_and_total(ours, theirs)
    assert record["ratio"]["pairs"] == [pytest.approx(ours["tokens_per_s"] / theirs["tokens_per_s"])]
    assert record["ratio_wall"]["pairs"] == [pytest.approx(ours["tokens_per_s_wall"] / theirs["tokens_per_s_wall"])]
    # the wall clock sees what the step timer does not: never faster than the median step by much
    assert ours["tokens_per_s_wall"] < ours["tokens_per_s"] * 1.2
    # the reference's own output: one record per step, from its own loop
    (reference,) = workdir.glob("reference-*.json")
    steps = json.loads(reference.read_text())["steps"]
    assert [s["step"] for s in steps] == list(range(1, 7)) and theirs["first_loss"] == steps[0]["loss"]
    (run,) = [p for p in workdir.glob("bench-*") if p.is_dir()]
    records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    assert [r["step"] for r in records if r.get("profiled")] == [2, 3]
    assert (run / "metrics.jsonl").is_file() and not (run / "checkpoints").exists() and not (run / "model").exists()
    assert f"results: {output}" in result.stdout and "trainkit / reference (wall clock):" in result.stdout


def test_one_vision_pair_on_cpu_writes_the_reference_ratio_and_the_input_pipelines_share(train_bench_pair):
    """`invoke bench train --model resnet-tiny --steps 6 --repeats 1`, after the language-model pair: trainkit on
    the run's JPEG tree, the bare DDP loop on the same tree, trainkit on on-device synthetic input."""
    result, folder = train_bench_pair
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((folder / "vision.json").read_text())
    assert record["job"]["model"] == "resnet-tiny" and record["job"]["processes"] == 2
    assert record["job"]["flops_per_image"] > 0 and record["job"]["sharding"] == "NO_SHARD"
    (ours,), (theirs,), (ceiling,) = record["trainkit"], record["reference"], record["synthetic_input"]
    assert (ours["steps_timed"], theirs["steps_timed"], ceiling["steps_timed"]) == (3, 5, 3)
    exposed_and_total(ours, theirs)
    exposed_and_total(ceiling, theirs)
    for side in (ours, theirs, ceiling):
        assert side["images_per_s"] > 0 and side["peak_memory_bytes"] > 0
        assert side["breakdown_s"]["forward_backward"] > 0 and side["breakdown_s"]["optimizer"] > 0
        assert math.isfinite(side["first_loss"]) and side["last_loss"] < side["first_loss"]  # each really trained
    assert ceiling["breakdown_s"]["input_wait"] < 0.01  # on-device input: nothing to wait for
    assert record["ratio"]["pairs"] == [pytest.approx(ours["images_per_s"] / theirs["images_per_s"])]
    assert record["input_pipeline"]["pairs"] == [pytest.approx(ours["images_per_s"] / ceiling["images_per_s"])]
    # the reference's own loop: its per-step file, over the same JPEG tree trainkit's run made
    (reference,) = (folder / "vision-runs").glob("reference-*.json")
    data = json.loads(reference.read_text())
    assert data["what"].startswith("bare DDP reference") and [s["step"] for s in data["steps"]] == list(range(1, 7))
    runs = sorted(p.name for p in (folder / "vision-runs").glob("bench-*") if p.is_dir())
    assert len(runs) == 2 and runs[1].endswith("-synthetic")
    synthetic = json.loads((folder / "vision-runs" / runs[1] / "spec.json").read_text())
    assert synthetic["data"]["synthetic"] is True
    assert "input pipeline: images/s =" in result.stdout and f"results: {folder / 'vision.json'}" in result.stdout


def test_one_lora_pair_on_cpu_adapts_the_same_pretrained_model_on_both_sides(train_bench_pair):
    """`invoke bench train --init pretrained --weights <folder> --lora-rank 8` (issue 53): trainkit's LoRA run and
    the bare loop with PEFT's get_peft_model on the same folder, both training only adapters, the FLOPs counted for
    LoRA (4 a frozen weight, 6 an adapter's)."""
    from training.decoders import DecoderArch

    result, folder = train_bench_pair
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((folder / "lora.json").read_text())
    job = record["job"]
    assert job["lora"] == {"rank": 8, "alpha": None, "targets": None}
    shape = DecoderArch.from_config(json.loads((folder / "base" / "config.json").read_text())).shape()
    assert job["flops_per_token"] == shape.flops_per_token(job["seq_len"], adapter_params=shape.adapter_params(8))
    (ours,), (theirs,) = record["trainkit"], record["reference"]
    for side in (ours, theirs):
        assert side["tokens_per_s"] > 0 and math.isfinite(side["first_loss"])
    (reference,) = (folder / "lora-runs").glob("reference-*.json")
    assert "LoRA through PEFT's get_peft_model" in json.loads(reference.read_text())["what"]
    assert theirs["first_loss"] == pytest.approx(ours["first_loss"], abs=0.05)  # the same base, the same data
