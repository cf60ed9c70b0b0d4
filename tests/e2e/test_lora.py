"""LoRA on 2 FSDP2 processes (issue 53), from a pretrained model folder made here (random weights, nothing downloaded):
the adapters train and the base does not move, a checkpoint holds the adapters and their optimizer state only, a rank
killed with SIGKILL resumes to the same losses, and the exports load with plain peft / transformers and generate."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from tests.helpers.product import invoke, job_processes, read_jsonl, start_invoke
from tests.helpers.tiny_decoders import write_pretrained
from tests.helpers.waiting import latest_step, wait_for
from training.common.checkpoint import STALL_ENV
from training.common.training_state import ADAPTERS

LORA = ("--init", "pretrained", "--lora-rank", "8", "--nproc", "2", "--metrics-port", "0", "--lr", "0.002")
LORA += ("--steps", "9", "--checkpoint-interval", "3", "--export", "merged", "--eval-fraction", "0.05")


def trained_count(said: str) -> int:
    """The trained parameters the trainer's LoRA line names: `LoRA rank R, alpha A on T: N of M parameters ...`."""
    line = next(line for line in said.splitlines() if line.startswith("LoRA rank "))
    return int(line.split(": ")[1].split(" of ")[0].replace(",", ""))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return write_pretrained(tmp_path_factory.mktemp("base") / "llama2", "llama2", seed=3)


@pytest.fixture(scope="module")
def adapted(base, tmp_path_factory):
    """The uninterrupted run."""
    runs = tmp_path_factory.mktemp("lora")
    done = invoke("train", "--model", str(base), "--runs-dir", str(runs), "--run-id", "adapted", *LORA)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return runs, done


def test_adapters_train_on_a_frozen_base_and_checkpoints_hold_only_them(base, adapted):
    runs, done = adapted
    run = runs / "adapted"
    records = read_jsonl(run / "metrics.jsonl")
    losses = [r["loss"] for r in records]
    assert losses[-1] < losses[0] - 0.05, losses
    evaluated = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]  # evaluation works under LoRA
    assert [step for step, _ in evaluated] == [3, 6, 9] and evaluated[-1][1] < evaluated[0][1], evaluated
    said = next(line for line in done.stdout.splitlines() if line.startswith("LoRA rank 8"))
    # llama2's 7 linear layers a decoder layer (attention's 4, the MLP's 3), found in the model itself
    assert " on q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj: " in said, said
    # what DCP wrote: every model tensor is an adapter's, and the optimizer's state is theirs only
    metadata = FileSystemReader(str(run / "checkpoints" / "step-00000009" / ADAPTERS)).read_metadata()
    keys = list(metadata.state_dict_metadata)
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys), model_keys[:4]
    assert len(model_keys) == 2 * 7 * 2  # A and B of 7 layers, 2 decoder layers
    optimizer_keys = [k for k in keys if k.startswith("optimizer.state.")]
    assert optimizer_keys and all(".lora_A." in k or ".lora_B." in k for k in optimizer_keys), optimizer_keys[:4]
    # and its sizes: the trained parameters once as weights and once per Adam moment, nothing of the base
    trained = trained_count(done.stdout)

    def count(ending: str) -> int:
        sizes = metadata.state_dict_metadata
        return sum(sizes[k].size.numel() for k in keys if k.endswith(ending) and hasattr(sizes[k], "size"))

    assert sum(metadata.state_dict_metadata[k].size.numel() for k in model_keys) == trained
    assert count(".exp_avg") == count(".exp_avg_sq") == trained
    held = json.loads((run / "summary.json").read_text())["lora"]  # fp32: base and adapters alike
    assert held == {
        "frozen_dtypes": ["float32"],
        "trained_dtypes": ["float32"],
        "trained_params": trained,
        "optimizer_params": trained,
        "frozen_in_optimizer": 0,
    }


def test_a_rank_killed_while_writing_a_checkpoint_resumes_to_the_same_losses_and_on_one_process(
    base, adapted, tmp_path
):
    """Rank 0 SIGKILLed while the step-6 checkpoint is written: torchrun restarts the ranks, which load the base
    from its folder again and the adapters and their optimizer state from step 3, and train to the same losses. Then
    the whole job is SIGKILLed once it has published step 6 again, and the same command on one process continues
    from there: the adapters' DCP checkpoint resharded to a world of 1, within the elastic tests' tolerance."""
    reference = {r["step"]: r["loss"] for r in read_jsonl(adapted[0] / "adapted" / "metrics.jsonl")}
    args = ("train", "--model", str(base), "--runs-dir", str(tmp_path), "--run-id", "killed", *LORA)
    process = start_invoke(*args, env={STALL_ENV: "3"})  # each save waits 3 s before it is published
    run_dir, checkpoints = tmp_path / "killed", tmp_path / "killed" / "checkpoints"
    wait_for(lambda: latest_step(run_dir) == 3, 120, "first checkpoint published")
    wait_for(lambda: (checkpoints / ".tmp-step-00000006").is_dir(), 60, "second checkpoint being written")
    time.sleep(1)
    ranks = [int(line.split()[0]) for line in job_processes(f"{run_dir}/spec.json") if "trainkit.run.agent" not in line]
    main = next(pid for pid in ranks if b"\0RANK=0\0" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes())
    os.kill(main, signal.SIGKILL)
    wait_for(lambda: latest_step(run_dir) == 6, 120, "step 6 published by the restarted ranks")
    os.killpg(int((run_dir / "launcher.pid").read_text()), signal.SIGKILL)  # in the 3 s before step 9's
    process.kill()
    process.wait()
    assert latest_step(run_dir) == 6
    resumed = {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl")}
    assert [resumed[step].hex() for step in range(1, 7)] == [reference[step].hex() for step in range(1, 7)]

    one = list(args)
    one[one.index("--nproc") + 1] = "1"
    done = invoke(*one, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "note: resuming step 6 of a 2-process run on 1 process\n" in done.stdout, done.stdout[-3000:]
    resumes = [(e["step"], e["world_size"]) for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "resume"]
    assert resumes == [(3, 2), (6, 1)]
    losses = {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl")}
    assert sorted(losses) == list(range(1, 10)), "steps must not repeat or vanish"
    assert losses[6] == reference[6] and losses[9] == pytest.approx(reference[9], abs=1e-4), (losses, reference)
    assert all(abs(losses[step] - reference[step]) <= 1e-4 for step in (7, 8)), (losses, reference)


def test_the_adapter_loads_with_peft_equals_the_merged_model_and_both_generate(base, adapted):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    runs, _ = adapted
    run = runs / "adapted"
    config = json.loads((run / "model" / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16 and config["base_model_name_or_path"] == str(base)
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), run / "model").eval()
    merged = AutoModelForCausalLM.from_pretrained(run / "model-merged").eval()
    plain = AutoModelForCausalLM.from_pretrained(base).eval()
    ids = torch.randint(3, 259, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        with_adapter, with_merged, without = adapter(ids).logits, merged(ids).logits, plain(ids).logits
    assert (with_adapter - with_merged).abs().max() < 1e-4  # fp32 here; bf16 exports differ by bf16's rounding
    assert (with_adapter - without).abs().max() > 1e-2  # the adapters changed what the base computes

    prompt = ("--prompt", "A: The train is late again.\nB: Then we take the bus.", "--max-new-tokens", "12")
    from_merged = invoke("generate", "--run-id", "adapted", "--runs-dir", str(runs), *prompt)
    assert from_merged.returncode == 0 and from_merged.stdout.strip(), from_merged.stderr[-2000:]
    shutil.rmtree(run / "model-merged")  # the adapter on its base, through peft: the same greedy tokens
    from_adapter = invoke("generate", "--run-id", "adapted", "--runs-dir", str(runs), *prompt)
    assert from_adapter.returncode == 0 and from_adapter.stdout == from_merged.stdout, from_adapter.stderr[-2000:]


def test_another_decoder_type_trains_adapters_on_the_layers_it_names_under_every_fast_path(tmp_path):
    """Qwen2 (biases on q, k and v, a tied LM head): adapters on the targets given, under SHARD_GRAD_OP, bf16, the
    layers compiled and every second one checkpointed. The frozen base is held in bf16 and the adapters in fp32, and
    only the adapters reach the optimizer."""
    base = write_pretrained(tmp_path / "qwen2", "qwen2", seed=4)
    flags = ("--init", "pretrained", "--lora-rank", "4", "--lora-targets", "q_proj,v_proj,down_proj", "--nproc", "2")
    flags += ("--steps", "8", "--warmup-steps", "0", "--metrics-port", "0", "--lr", "0.01", "--run-id", "qwen")
    flags += ("--sharding", "SHARD_GRAD_OP", "--precision", "bf16", "--compile", "true")
    flags += ("--activation-checkpointing", "true", "--ac-every", "2")
    done = invoke("train", "--model", str(base), "--runs-dir", str(tmp_path / "runs"), *flags)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "runs" / "qwen"
    losses = [r["loss"] for r in read_jsonl(run / "metrics.jsonl")]
    assert losses[-1] < losses[0] - 0.05, losses
    saved = json.loads((run / "model" / "adapter_config.json").read_text())
    assert sorted(saved["target_modules"]) == ["down_proj", "q_proj", "v_proj"]
    summary = json.loads((run / "summary.json").read_text())
    taken, held = summary["fast_paths"], summary["lora"]
    layers = json.loads((base / "config.json").read_text())["num_hidden_layers"]
    assert taken["compiled_layers"] == list(range(layers)) and taken["graphs_compiled"] >= 1, taken
    assert taken["checkpointed_layers"] == list(range(0, layers, 2)), taken
    assert (taken["param_dtype"], taken["reduce_dtype"]) == ("bfloat16", "float32"), taken
    assert summary["sharding"]["strategy"] == "SHARD_GRAD_OP", summary["sharding"]
    assert held["frozen_dtypes"] == ["bfloat16"] and held["trained_dtypes"] == ["float32"], held
    trained = trained_count(done.stdout)
    assert held["trained_params"] == held["optimizer_params"] == trained and held["frozen_in_optimizer"] == 0, held
