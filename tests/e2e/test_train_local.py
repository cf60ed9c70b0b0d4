"""Real 2-process FSDP runs on CPU, launched the way users launch them, checked by what they leave."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.helpers.paths import HELPERS, REPO
from tests.helpers.planted import Planted
from tests.helpers.product import (
    invoke,
    job_processes,
    only_run_dir,
    output,
    read_jsonl,
    run_folder,
    start_invoke,
    tiny_args,
)
from tests.helpers.waiting import latest_step, wait_for
from training.common.failure import EXIT_NO_RETRY
from training.text import formats, packing, records
from training.text.dialogues import write_dialogues
from training.text.tokenizer import load_tokenizer
from trainkit.services import free_port_pair

# --------------------------------------------------------------------------- first contact


def test_make_train_learns_and_exports_a_loadable_hf_model(tiny_run):
    summary = json.loads((tiny_run / "summary.json").read_text())
    metrics = read_jsonl(tiny_run / "metrics.jsonl")
    assert summary["steps"] == 60 and [r["step"] for r in metrics] == list(range(1, 61))
    assert summary["last_loss"] <= 0.7 * summary["first_loss"], summary
    assert summary["first_loss"] == metrics[0]["loss"] and summary["last_loss"] == metrics[-1]["loss"]
    assert summary["tokens_per_s_median"] > 0 and summary["wall_time_s"] > 0 and summary["resumed_from"] is None
    assert summary["mfu_median"] is None  # CPU: no peak FLOP/s in the table and none given
    assert set(metrics[1]) >= {"loss", "lr", "tokens_per_s", "step_time_s", "mfu", "peak_memory_bytes"}
    # warmup then cosine: lr rises for 6 steps, peaks at 3e-3, ends near 10% of peak
    lrs = [r["lr"] for r in metrics]
    assert lrs[:6] == sorted(lrs[:6]) and max(lrs) == pytest.approx(3e-3) and lrs[-1] < 0.5e-3

    model = AutoModelForCausalLM.from_pretrained(tiny_run / "model")
    tokenizer = AutoTokenizer.from_pretrained(tiny_run / "model")
    assert sum(p.numel() for p in model.parameters()) == summary["sharding"]["total_params"]
    ids = torch.tensor([[1, *tokenizer("Summarize", add_special_tokens=False)["input_ids"]]])
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], 512)
    # Ready to serve (issue 50): the cache on, the tokenizer's stop token, the dtype it trained in (fp32 on a CPU),
    # a model card with the training facts.
    exported = json.loads((tiny_run / "model" / "config.json").read_text())
    assert exported["use_cache"] is True and exported.get("dtype", exported.get("torch_dtype")) == "float32"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id and model.generation_config.use_cache
    out = model.generate(ids, max_new_tokens=2, do_sample=False, return_dict_in_generate=True)
    assert out.past_key_values is not None
    card = (tiny_run / "model" / "README.md").read_text()
    assert f"**final loss**: {summary['last_loss']:.4f}" in card and "**weights**: float32" in card
    spec = json.loads((tiny_run / "spec.json").read_text())
    assert spec["model"]["name"] == "llama2-tiny" and spec["parallelism"]["sharding"] == "FULL_SHARD"
    assert spec["parallelism"]["nproc"] == 2


def test_rerunning_a_finished_run_says_so_and_changes_nothing(tiny_run):
    before = (tiny_run / "summary.json").read_text()
    result = invoke("train", "--model", "llama2-tiny", "--runs-dir", str(tiny_run.parent), "--metrics-port", "0")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"run {tiny_run.name} already finished at step 60" in result.stdout
    assert (tiny_run / "summary.json").read_text() == before


def test_a_finished_run_is_recognised_without_loading_its_checkpoint(tiny_run, tmp_path):
    """From summary.json and trainer_state.json alone: with the weights of its checkpoint emptied, a copy of
    the finished run still reports itself finished (loading them would fail)."""
    copy = tmp_path / "runs" / tiny_run.name
    shutil.copytree(tiny_run, copy)
    latest = copy / "checkpoints" / (copy / "checkpoints" / "latest").read_text().strip()
    for weights in [*latest.rglob("*.distcp"), *latest.rglob("*.bin"), *latest.rglob("*.safetensors")]:
        weights.write_bytes(b"")
    assert any(p.stat().st_size == 0 for p in latest.rglob("*") if p.is_file())
    result = invoke("train", "--model", "llama2-tiny", "--runs-dir", str(copy.parent), "--metrics-port", "0")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"run {tiny_run.name} already finished at step 60" in result.stdout


def test_fsdp_really_shards_each_rank_holds_half(tiny_run):
    sharding = json.loads((tiny_run / "summary.json").read_text())["sharding"]
    assert sharding["strategy"] == "FULL_SHARD" and sharding["world_size"] == 2
    assert abs(sharding["local_params"] - sharding["total_params"] / 2) <= 0.02 * sharding["total_params"]


# --------------------------------------------------------------------------- crash and resume


# A SIGKILL after a checkpoint, then the same command again (the run taken over, resumed with the undisturbed run's
# losses): tests/e2e/test_stall_watchdog.py, in the run that first recovers from a hang.


def test_the_same_run_launched_twice_at_once_trains_once(tmp_path):
    """One writer per run: the second launch is refused (exit 2, naming the first) and touches nothing."""
    args = tiny_args(tmp_path, "--steps", "10")
    first = start_invoke(*args)
    run_dir = wait_for(lambda: run_folder(tmp_path), 60, "run dir")
    wait_for(lambda: (run_dir / "launcher.json").exists(), 60, "the first launch to own the run")
    spec = (run_dir / "spec.json").read_text() if (run_dir / "spec.json").exists() else None
    second = invoke(*args)
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"is being trained by pid {first.pid}" in second.stderr and "one writer per run" in second.stderr
    assert "Traceback" not in second.stderr and len(second.stderr.strip().splitlines()) == 1
    assert first.wait(timeout=300) == 0, output(first)
    events = [json.loads(line)["event"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events.count("start") == 1 and events.count("finish") == 1 and "resume" not in events
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == list(range(1, 11))
    if spec is not None:
        assert json.loads((run_dir / "spec.json").read_text()) == json.loads(spec)


# A rank SIGKILLed while a checkpoint is written: the previous one stays the latest and the restarted ranks resume
# from it: tests/e2e/test_evaluation.py, with held-out evaluation (the resumed evaluation is the uninterrupted run's).


# --------------------------------------------------------------------------- strategies and guards


def small_dataset(path: Path, count: int) -> tuple[Path, int]:
    """A local JSONL data set and how many optimizer steps one epoch of it is at global batch 16 (blocks
    of 128 tokens that hold a response token)."""
    write_dialogues(path, count=count, seed=5)
    encoded = formats.encode(records.resolve(str(path)).records(), "dialogue-summary", load_tokenizer("byte"))
    return path, len(packing.pack_decoder(encoded, 128)["input_ids"]) // 16


@pytest.mark.parametrize(
    ("strategy", "share", "precision", "policy"),
    [("SHARD_GRAD_OP", 0.5, "bf16", ("bfloat16", "float32")), ("NO_SHARD", 1.0, "fp32", (None, None))],
)
def test_other_strategies_run_an_epoch_of_a_local_jsonl_and_distribute_parameters_as_named(
    strategy, share, precision, policy, tmp_path
):
    dataset, steps_per_epoch = small_dataset(tmp_path / "small.jsonl", count=60)
    runs = tmp_path / "runs"
    flags = ("--sharding", strategy, "--epochs", "1", "--dataset", str(dataset), "--precision", precision)
    result = invoke(*tiny_args(runs, *flags))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = json.loads((only_run_dir(runs) / "summary.json").read_text())
    sharding = summary["sharding"]
    assert sharding["strategy"] == strategy and summary["steps"] == steps_per_epoch > 0
    assert sharding["local_params"] == pytest.approx(share * sharding["total_params"], rel=0.02)
    # bf16 under FSDP2 on CPU as on GPUs: bf16 parameters, fp32 reductions (the default), not autocast alone
    taken = summary["fast_paths"]
    assert (taken.get("param_dtype"), taken.get("reduce_dtype")) == policy


def test_a_failing_job_exits_non_zero_with_the_reason(tmp_path):
    """Too little data for one global batch is only known once the workers have tokenised it: bad data, which no
    restart mends (two were allowed)."""
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps({"prompt": "Say hi.", "response": "hi"}) + "\n")
    result = invoke(*tiny_args(tmp_path / "runs", "--dataset", str(small), "--steps", "2", "--max-restarts", "2"))
    assert result.returncode == EXIT_NO_RETRY
    cause = result.stderr.strip().splitlines()[-1]
    assert cause.startswith("error: run ") and "failed: rank " in cause, result.stderr[-2000:]
    # its one example packs whole into one padded block: one sample for a batch of 16
    assert "DataError: dataset has 1 samples, fewer than one global batch of 16" in cause
    assert f"while reading dataset {small}" in cause


def test_guard_stops_fsdp_that_accelerate_silently_turned_into_ddp_or_copies():
    """Run the guard under torchrun with Accelerate left stock: it must refuse, not train."""
    script = HELPERS / "guard_check.py"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("guard ok") == 2


# --------------------------------------------------------------------------- secrets, signals, metrics


def test_pretrained_weights_load_and_the_token_never_reaches_files_or_argv(tiny_run, tmp_path):
    token = "hf_secretTOKEN_do_not_leak_123"
    process = start_invoke(
        *tiny_args(tmp_path, "--init", "pretrained", "--weights", str(tiny_run / "model"), "--steps", "3"),
        env={"HF_TOKEN": token},
    )
    seen_argv = []
    while process.poll() is None:
        seen_argv += [line for line in job_processes(str(tmp_path)) if token in line]
        time.sleep(0.2)
    text = output(process)
    assert process.returncode == 0, text[-3000:]
    assert not seen_argv and token not in text
    run_dir = only_run_dir(tmp_path)
    for path in run_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            assert token.encode() not in path.read_bytes(), path
    summary = json.loads((run_dir / "summary.json").read_text())
    # starts from the trained tiny model, so the first loss is already far below random init (ln 512 = 6.2)
    assert summary["first_loss"] < 3.0


def test_ctrl_c_stops_every_process_and_the_exit_code_says_so(tmp_path):
    port = free_port_pair()
    process = start_invoke(
        "train", "--model", "llama2-tiny", "--runs-dir", str(tmp_path), "--steps", "500", "--metrics-port", str(port)
    )
    run_dir = wait_for(lambda: run_folder(tmp_path), 60, "run dir")
    wait_for(lambda: (run_dir / "metrics.jsonl").exists(), 120, "first logged step")
    for rank in (0, 1):  # every rank serves its metrics, labelled
        body = urllib.request.urlopen(f"http://127.0.0.1:{port + rank}/metrics", timeout=5).read().decode()
        assert re.search(rf'trainkit_train_loss\{{.*rank="{rank}".*\}} \d', body), body[-1500:]
        assert f'run_id="{run_dir.name}"' in body and 'model="llama2-tiny"' in body
    assert len(job_processes(str(run_dir))) >= 3  # torchrun + 2 workers
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130
    wait_for(lambda: not job_processes(str(run_dir)), 10, "all job processes gone")
    # The stop ended at a step boundary with a checkpoint of that step: nothing to redo on resume.
    last_logged = max(r["step"] for r in read_jsonl(run_dir / "metrics.jsonl"))
    stops = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "stop"]
    assert stops and stops[0]["checkpoint"] == last_logged == latest_step(run_dir), stops


# --------------------------------------------------------------------------- real 7B layer shapes


def test_llama2_7b_truncated_to_one_layer_trains_with_true_shapes(tmp_path):
    result = invoke(
        "train",
        "--model",
        "llama2-7b",
        "--init",
        "random",
        "--layers",
        "1",  # the shapes under test are a layer's; one keeps the checkpoint (5.6 GB) and export (1.9 GB) small
        "--seq-len",
        "96",  # the layers' shapes are under test: the shortest that holds a whole dialogue's summary (<= 78 tokens)
        "--steps",
        "1",
        "--nproc",
        "2",
        "--runs-dir",
        str(tmp_path),
        "--metrics-port",
        "0",
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "llama2-7b truncated to 1 of 32 layers" in result.stdout
    run_dir = only_run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["truncated"] == "llama2-7b truncated to 1 of 32 layers" and summary["steps"] == 1
    # Each dialogue, longer than 96 byte tokens, is packed whole with its prompt cut from the left: every block has
    # its summary, so the step has a loss and a gradient.
    assert "whole examples, packing efficiency 100.0% (0 padding tokens; 2000 prompts cut from the left" in (
        result.stdout
    )
    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert 5 < record["loss"] < 20 and record["grad_norm"] > 0, record  # random init: about ln(32000) = 10.4
    config = json.loads((run_dir / "model" / "config.json").read_text())
    assert (config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]) == (4096, 11008, 32)
    assert config["num_hidden_layers"] == 1 and config["vocab_size"] == 32000
    assert json.loads((run_dir / "model" / "trainkit.json").read_text())["truncated"] == summary["truncated"]
    assert summary["sharding"]["total_params"] == 202_383_360 + 2 * 32000 * 4096 + 4096


# --------------------------------------------------------------------------- divergence


def strict_json(line: str) -> dict:
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(line, parse_constant=refuse)


def test_a_diverging_run_stops_at_the_step_and_publishes_nothing_non_finite(tmp_path):
    """A finite but absurd learning rate makes the loss overflow within a few steps: the job stops at that
    step on every rank with the step named, keeps the last good checkpoint, and refuses to resume."""
    args = tiny_args(tmp_path / "runs", "--lr", "1e30", "--steps", "12", "--checkpoint-interval", "1")
    result = invoke(*args, "--max-restarts", "1")
    assert result.returncode == EXIT_NO_RETRY, result.stdout[-2000:] + result.stderr[-2000:]
    cause = result.stderr.strip().splitlines()[-1]  # the launcher's one line
    found = re.search(
        r"rank \d: Diverged: training diverged at step (\d+): (loss|gradient norm) \S+ \(rank \d\)", cause
    )
    assert found, result.stdout[-3000:] + result.stderr[-3000:]
    step = int(found[1])
    run = only_run_dir(tmp_path / "runs")
    assert "Traceback" not in result.stdout + result.stderr
    assert {p.name for p in (run / "logs").glob("*/attempt_*")} == {
        "attempt_0"
    }  # not restarted: it would diverge again
    records = [strict_json(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["step"] < step for r in records)
    published = sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*"))
    assert all(s < step for s in published), (published, step)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "not_finite"] == [step]
    again = invoke(*args)
    refused = again.stderr.strip().splitlines()[-1]
    assert again.returncode == EXIT_NO_RETRY and f"stopped at step {step}" in refused and "not resumed" in refused


# --------------------------------------------------------------------------- damaged checkpoints


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory) -> Path:
    """A 6-step run with checkpoints at steps 4 and 6 (two kept); the tests drop its summary.json, as if
    it had stopped after its last checkpoint, so a re-run resumes instead of reporting it finished."""
    runs = tmp_path_factory.mktemp("six")
    result = invoke(*tiny_args(runs, "--steps", "6", "--checkpoint-interval", "2", "--run-id", "ck"))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return runs / "ck"


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("truncate", "of the wrong size"),  # a shard cut short (a full disk, a copy that stopped)
        ("remove", "missing"),  # the marker reached the disk, a shard did not (power loss)
        ("scramble", "does not load"),  # right size, wrong bytes: the scheduler state no longer unpickles
    ],
)
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_previous_one_resumed(six_steps, tmp_path, damage, why):
    run = tmp_path / "runs" / "ck"
    shutil.copytree(six_steps, run)
    (run / "summary.json").unlink()
    newest = run / "checkpoints" / "step-00000006"
    assert (run / "checkpoints" / "step-00000004").is_dir() and (newest / "MANIFEST.json").is_file()
    shard = sorted(newest.rglob("*.distcp"))[0]
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif damage == "remove":
        shard.unlink()
    else:
        states = newest / "custom_checkpoint_0.pkl"
        states.write_bytes(bytes(states.stat().st_size))
    result = invoke(*tiny_args(tmp_path / "runs", "--steps", "6", "--checkpoint-interval", "2", "--run-id", "ck"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "checkpoint step-00000006 is not usable" in result.stdout and why in result.stdout
    assert "resuming from step-00000004" in result.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"] == 4 and summary["steps"] == 6
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    set_aside = [e for e in events if e["event"] == "checkpoint_set_aside"]
    assert len(set_aside) == 1 and why in set_aside[0]["reason"] and set_aside[0]["kept_as"] == "corrupt-step-00000006"
    evidence = run / "checkpoints" / "corrupt-step-00000006"
    assert why in (evidence / "REJECTED").read_text()  # kept, with the reason, never read again
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-00000006"  # written again, whole
    assert (run / "checkpoints" / "step-00000006" / "MANIFEST.json").is_file()


def test_when_every_checkpoint_is_damaged_the_run_trains_again_from_the_start(six_steps, tmp_path):
    """The newest was planted by another job: its DCP metadata, which DCP itself unpickles with pickle.load, names
    code to run, and its manifest was rewritten to match; the older one has an empty shard."""
    run = tmp_path / "runs" / "ck"
    shutil.copytree(six_steps, run)
    (run / "summary.json").unlink()
    sorted((run / "checkpoints" / "step-00000004").rglob("*.distcp"))[0].write_bytes(b"")
    planted = run / "checkpoints" / "step-00000006"
    metadata = planted / "pytorch_model_fsdp_0" / ".metadata"
    metadata.write_bytes(pickle.dumps(Planted(tmp_path / "ran")))
    manifest = json.loads((planted / "MANIFEST.json").read_text())
    manifest["pytorch_model_fsdp_0/.metadata"] = metadata.stat().st_size
    (planted / "MANIFEST.json").write_text(json.dumps(manifest))
    result = invoke(*tiny_args(tmp_path / "runs", "--steps", "6", "--checkpoint-interval", "2", "--run-id", "ck"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "no usable checkpoint left (step-00000006, step-00000004 set aside)" in result.stdout
    refused = "pytorch_model_fsdp_0/.metadata would import posix.mkdir when unpickled"
    assert f"checkpoint step-00000006 is not usable (it does not load: RefusedCheckpoint: {refused}" in result.stdout
    assert not (tmp_path / "ran").exists()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"] is None and summary["steps"] == 6  # fresh processes, from step 0
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == list(range(1, 7))  # each step once
    kept = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("corrupt-"))
    assert kept == ["corrupt-step-00000004", "corrupt-step-00000006"]
