"""Every decoder type trainkit sizes, trained from a model folder the way users start it (`invoke train --model
<folder>`): Llama 3's and Qwen2's shapes by two FSDP2 processes on chat records (each with its folder's own chat
template and tokenizer), the others in one process from a folder of config.json alone (so with the byte tokenizer such
a folder trains with); each run of 4 steps resumed exactly from its step-2 checkpoint (two steps after it: the second
shows that the optimizer state and the schedule came back as well); every export loaded back by plain transformers
and made to generate.

What costs is starting 14 jobs on two CPU cores, not their steps: the launcher, the torchrun agent and every worker
import torch, and a launcher whose model folder holds a tokenizer imports transformers to count its ids (about 5 s of
CPU), so only the two folders that need one of their own (for their chat templates) hold one. All runs start at once,
a resumed copy as soon as its run ends, every worker on one thread (the launcher would give a one-process run both
cores, and the threads of seven runs at once would only wait for each other)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from tests.helpers.product import output, read_jsonl, start_invoke
from tests.helpers.tiny_decoders import TEMPLATES, TINY, tiny_config, write_tiny
from training.common.checkpoint import LATEST, step_dir_name
from training.registry import DecoderArch

SHARDED = ("llama3", "qwen2")  # two processes, FULL_SHARD (the default)
ONE_PROCESS = tuple(kind for kind in TINY if kind not in SHARDED)
MIDDLE, LAST = 2, 4  # the checkpoint a resumed copy starts from; the run's last step (a checkpoint every MIDDLE)
# --seq-len 160: examples are packed whole (training/text/packing.py), and llama3's template makes each conversation
# about 257 tokens, its first reply after 119: 160 keeps every one, cut from the left of its prompt.
SMALL = ("--seq-len", "160", "--global-batch-size", "4", "--micro-batch-size", "2", "--metrics-port", "0")
WAIT_S = 300
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def write_chat(path: Path) -> Path:
    """Two-turn conversations: what the models with a template of their own (TEMPLATES) train on. Written once:
    every run of them (and each resumed copy) reads the same file, so the same tokenised cache."""
    if path.is_file():
        return path
    rows = []
    for index in range(120):
        question, answer = f"What is {index} plus one?", f"It is {index + 1}."
        turns = [("user", question), ("assistant", answer), ("user", "Sure?"), ("assistant", "Yes.")]
        rows.append({"messages": [{"role": role, "content": content} for role, content in turns]})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def train_args(folder: Path, runs: Path, kind: str) -> list[str]:
    nproc = "2" if kind in SHARDED else "1"
    flags = ["--nproc", nproc, "--steps", str(LAST), "--checkpoint-interval", str(MIDDLE)]
    if kind in TEMPLATES:
        flags += ["--dataset", str(write_chat(folder.parent / "chat.jsonl"))]
    return ["train", "--model", str(folder), "--runs-dir", str(runs), *flags, *SMALL]


def start(folder: Path, runs: Path, kind: str) -> tuple[subprocess.Popen, Path]:
    return start_invoke(*train_args(folder, runs, kind), env=ONE_THREAD), runs


def only_dir(runs: Path) -> Path:
    (run,) = [path for path in runs.iterdir() if path.is_dir() and not path.name.startswith(".")]
    return run


def back_to_halfway(run: Path, copy: Path) -> None:
    """A copy of a finished run as it was when its halfway checkpoint was the newest: what a crash after that step
    leaves (the launcher resumes from `latest`)."""
    shutil.copytree(run, copy)
    checkpoints = copy / "checkpoints"
    shutil.rmtree(checkpoints / step_dir_name(LAST))
    (checkpoints / LATEST).write_text(step_dir_name(MIDDLE) + "\n")
    kept = [record for record in read_jsonl(copy / "metrics.jsonl") if record["step"] <= MIDDLE]
    (copy / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in kept))
    (copy / "summary.json").unlink()
    shutil.rmtree(copy / "model")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """kind -> its run folder; `<kind>-resumed` -> the copy resumed from its halfway checkpoint."""
    root = tmp_path_factory.mktemp("architectures")
    started, done = {}, {}
    for kind in (*SHARDED, *ONE_PROCESS):  # the sharded ones first: their resumed copies follow them
        folder = write_tiny(root / "models" / kind, kind, tokenizer=kind in TEMPLATES)
        started[kind] = start(folder, root / kind, kind)
    deadline = time.monotonic() + WAIT_S
    while started:
        assert time.monotonic() < deadline, f"still running after {WAIT_S} s: {sorted(started)}"
        for name, (process, runs_dir) in list(started.items()):
            if process.poll() is None:
                continue
            assert process.returncode == 0, f"{name}:\n{output(process)[-3000:]}"
            del started[name]
            done[name] = only_dir(runs_dir)
            if not name.endswith("-resumed"):
                resumed_runs = root / f"{name}-resumed"
                back_to_halfway(done[name], resumed_runs / done[name].name)
                started[f"{name}-resumed"] = start(root / "models" / name, resumed_runs, name)
        time.sleep(0.2)
    return done


@pytest.mark.parametrize("kind", SHARDED)
def test_two_fsdp_processes_shard_each_layer_and_resume_exactly(runs, kind):
    summary = json.loads((runs[kind] / "summary.json").read_text())
    sharding, layers = summary["sharding"], summary["fast_paths"]["reshard_after_forward"]
    assert sharding["strategy"] == "FULL_SHARD" and sharding["world_size"] == 2
    assert abs(sharding["local_params"] - sharding["total_params"] / 2) <= 0.05 * sharding["total_params"]
    assert layers == [True, True]  # each decoder layer its own FSDP unit: the model's own layer class was found
    assert sharding["total_params"] == DecoderArch.from_config(tiny_config(kind)).parameters()


@pytest.mark.parametrize("kind", ONE_PROCESS)
def test_one_process_trains_checkpoints_and_exports(runs, kind):
    run = runs[kind]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == LAST and summary["sharding"]["world_size"] == 1
    assert all(record["loss"] == record["loss"] for record in read_jsonl(run / "metrics.jsonl"))  # no NaN
    assert (run / "checkpoints" / LATEST).read_text().strip() == step_dir_name(LAST)
    assert summary["hf_model_dir"] == str(run / "model")


@pytest.mark.parametrize("kind", sorted(TINY))
def test_a_run_resumed_from_its_halfway_checkpoint_repeats_the_same_losses(runs, kind):
    resumed = runs[f"{kind}-resumed"]
    assert json.loads((resumed / "summary.json").read_text())["resumed_from"] == MIDDLE
    again = {record["step"]: record["loss"] for record in read_jsonl(resumed / "metrics.jsonl")}
    first = {record["step"]: record["loss"] for record in read_jsonl(runs[kind] / "metrics.jsonl")}
    assert sorted(again) == sorted(first) == list(range(1, LAST + 1))
    for step in range(MIDDLE + 1, LAST + 1):
        assert abs(again[step] - first[step]) <= 1e-5, (step, again[step], first[step])


@pytest.mark.parametrize("kind", sorted(TINY))
def test_the_export_loads_in_plain_transformers_and_generates(runs, kind):
    model = AutoModelForCausalLM.from_pretrained(runs[kind] / "model")
    tokenizer = AutoTokenizer.from_pretrained(runs[kind] / "model")
    config = tiny_config(kind)
    assert type(model).__name__ == config["architectures"][0] and model.config.model_type == config["model_type"]
    assert sum(p.numel() for p in model.parameters()) == DecoderArch.from_config(config).parameters()
    if kind in TEMPLATES:  # trained on chat records rendered with the folder's own template, which the export keeps
        assert tokenizer.chat_template == TEMPLATES[kind]
        assert json.loads((runs[kind] / "summary.json").read_text())["data"]["format"] == "chat"
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
        )
        prompt = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    else:
        prompt = torch.tensor([[1, *tokenizer("Summarize:", add_special_tokens=False)["input_ids"]]])
    generated = model.generate(prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert generated.shape == (1, prompt.shape[1] + 4) and torch.equal(generated[:, : prompt.shape[1]], prompt)


def exported_dtypes(folder: Path) -> set[str]:
    """The dtypes of every tensor in the export's safetensors files, from their headers."""
    found = set()
    for path in folder.glob("*.safetensors"):
        with path.open("rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size))
        found |= {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}
    return found


def test_a_bf16_pretrained_folder_exports_in_bf16_with_its_own_generation_config_and_a_cache(tmp_path):
    """Issue 50: the export kept use_cache off, replaced the source's generation config and widened bf16 to fp32.
    A bf16 Qwen2-style folder with stop tokens and sampling of its own, fine-tuned two steps: its export is bf16,
    says use_cache, keeps that generation config, generates with a cache, and has a model card."""
    folder = write_tiny(tmp_path / "qwen2-bf16", "qwen2", tokenizer=True)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(
        AutoConfig.for_model(**tiny_config("qwen2")), dtype=torch.bfloat16
    ).save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    own = {"eos_token_id": [tokenizer.eos_token_id, 4], "do_sample": True, "temperature": 0.7, "top_p": 0.8}
    GenerationConfig(**own, repetition_penalty=1.05).save_pretrained(folder)
    runs = tmp_path / "runs"
    args = ["train", "--model", str(folder), "--init", "pretrained", "--weights", str(folder), "--runs-dir", str(runs)]
    args += ["--nproc", "1", "--steps", "2", "--checkpoint-interval", "0", *SMALL]
    args += ["--dataset", str(write_chat(tmp_path / "chat.jsonl"))]
    process = start_invoke(*args, env=ONE_THREAD)
    assert process.wait(timeout=WAIT_S) == 0, output(process)[-3000:]
    export = only_dir(runs) / "model"
    assert exported_dtypes(export) == {"BF16"}
    config = json.loads((export / "config.json").read_text())
    assert config["use_cache"] is True and config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    generation = json.loads((export / "generation_config.json").read_text())
    assert {key: generation[key] for key in own} == own and generation["repetition_penalty"] == 1.05
    model = AutoModelForCausalLM.from_pretrained(export)
    prompt = torch.tensor([tokenizer("Hi", add_special_tokens=False)["input_ids"]])
    out = model.generate(prompt, max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    assert out.past_key_values is not None and out.sequences.shape[1] == prompt.shape[1] + 3
    card = (export / "README.md").read_text()
    assert "**weights**: bfloat16" in card and "**final loss**: " in card and f"**source**: {folder}" in card
    assert "**architecture**: Qwen2ForCausalLM" in card and "**steps**: 2, of 4 sequences each" in card
