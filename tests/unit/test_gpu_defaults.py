"""The Llama 2 recipes' GPU fast paths (training/registry.py: compile, recompute every 2nd layer, chosen by
benchmarks/llama2-7b-sweep-h200.json) apply on GPUs only and only where they can run; the sweep that chose them
builds its variants' command lines and its combined run as it says."""

from __future__ import annotations

import importlib

import pytest

from trainkit.bench.sweep import combined, variant_command
from trainkit.job import Machine, build, derive, validate

GPU = Machine(gpus_per_node=8, described="8 GPUs")
build_module = importlib.import_module("trainkit.job.build")  # the module; trainkit.job.build is the function
CPU = Machine(gpus_per_node=0, process_limit=2, described="2 CPU core(s) and no GPU")


def derived(machine: Machine, **flags):
    job = build({"model": "llama2-7b", "nproc": machine.gpus_per_node or 2, **flags})
    derive(job, machine)
    validate(job, machine)
    return job


@pytest.mark.parametrize("target", ["eks", "sagemaker"])
def test_a_gpu_job_compiles_and_recomputes_every_second_layer(target):
    p = derived(GPU, target=target).parallelism
    assert (p.compile, p.activation_checkpointing, p.ac_every) == (True, True, 2)


def test_the_70b_recipe_recomputes_every_layer():
    p = derived(GPU, model="llama2-70b", target="eks").parallelism
    assert (p.compile, p.activation_checkpointing, p.ac_every) == (True, True, None)


def test_a_cpu_job_keeps_the_spec_defaults():
    p = derived(CPU).parallelism
    assert (p.compile, p.ac_every) == (None, None)


def test_given_flags_win_and_checkpointing_off_drops_the_layer_choice():
    p = derived(GPU, target="eks", compile=False, ac_every=1).parallelism
    assert (p.compile, p.ac_every) == (False, 1)
    p = derived(GPU, target="eks", activation_checkpointing=False).parallelism
    assert (p.activation_checkpointing, p.ac_every) == (False, None)  # validate would refuse --ac-every alone


def test_a_local_gpu_without_a_compiler_runs_uncompiled_with_a_note(monkeypatch):
    monkeypatch.setattr(build_module.shutil, "which", lambda name: None)
    monkeypatch.delenv("CC", raising=False)
    job = derived(GPU)
    assert job.parallelism.compile is None
    assert any("not compiling the layers" in note and "C compiler" in note for note in job.run.notes)


def test_the_sweeps_variant_replaces_a_given_flag():
    given = ["--model", "llama2-7b", "--compile", "false", "--ac-every", "1"]
    command = variant_command(given, ["--compile", "true"])
    assert command == ["--model", "llama2-7b", "--ac-every", "1", "--compile", "true", "--log-interval", "1"]


def test_the_combined_run_takes_only_the_winners():
    results = {
        "plain": {"tokens_per_s": 100.0},
        "compile": {"tokens_per_s": 120.0},
        "flash": {"tokens_per_s": 100.5},  # within the margin
        "ac-every-2": {"tokens_per_s": 110.0},
        "prefetch-1": {"error": "refused"},
    }
    assert combined(results, 0.01) == ["--compile", "true", "--activation-checkpointing", "true", "--ac-every", "2"]
    assert combined({"compile": {"tokens_per_s": 5.0}}, 0.01) == []  # no plain run: nothing to beat


@pytest.mark.parametrize(("model", "said"), [("bert-large", True), ("bert-1.5b", True), ("bert-tiny", False)])
def test_a_bert_of_a_published_shape_says_its_byte_tokenizer_makes_it_incomparable(model, said):
    """Issue 50: BERT trains on bytes, not the WordPiece vocabulary its shape was published with; bert-tiny's
    vocabulary was sized for the bytes."""
    job = build({"model": model})
    derive(job, GPU)
    notes = [note for note in job.run.notes if "byte tokenizer" in note]
    assert len(notes) == said
    if said:
        assert "261 of its 30,522 embedding rows used; --seq-len 128 holds about 25 English words" in notes[0]
        assert "not comparable to WordPiece-trained BERT's" in notes[0]
