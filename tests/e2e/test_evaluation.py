"""Held-out evaluation of a real 2-process FSDP run (issue 52), launched as users launch it and judged by what it
leaves: the held-out records are never trained on, the evaluation loss falls, the figures are where users look,
evaluating changes nothing of the training (its losses bit for bit), and a run killed between two evaluations resumes
to the same evaluations as the uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.helpers.product import invoke, job_processes, output, read_jsonl, start_invoke, tiny_args
from tests.helpers.waiting import latest_step, wait_for
from training.common.checkpoint import STALL_ENV
from training.text.dialogues import write_dialogues

EVAL = ("--nproc", "2", "--eval-fraction", "0.1", "--steps", "9", "--checkpoint-interval", "3")


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """The uninterrupted run: evaluated at steps 3, 6 and 9."""
    runs = tmp_path_factory.mktemp("evaluated")
    done = invoke(*tiny_args(runs, "--run-id", "evaluated", *EVAL))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return runs, done


def test_held_out_records_are_evaluated_at_every_checkpoint_and_evaluating_moves_no_training_loss(evaluated):
    runs, done = evaluated
    run = runs / "evaluated"
    records = read_jsonl(run / "metrics.jsonl")
    evaluated = [(r["step"], r["eval_loss"], r["eval_ppl"]) for r in records if "eval_loss" in r]
    assert [step for step, _, _ in evaluated] == [3, 6, 9], evaluated  # at each checkpoint, the last included
    assert evaluated[-1][1] < evaluated[0][1], evaluated
    assert all(abs(ppl - 2.718281828459045**loss) < 1e-6 * ppl for _, loss, ppl in evaluated)
    for step, loss, _ in evaluated:  # its own line, which SageMaker's metric definitions read
        assert f"evaluated eval at step {step}: eval_loss={loss:.4f}" in done.stdout, done.stdout[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    best = min(evaluated, key=lambda e: e[1])
    assert summary["evaluation"] == {
        "metric": "eval_loss",
        "evaluations": 3,
        "first": evaluated[0][1],
        "last": evaluated[-1][1],
        "best": best[1],
        "best_step": best[0],
    }
    assert f"eval        eval_loss {evaluated[0][1]:.4f} -> {evaluated[-1][1]:.4f}" in done.stdout
    status = invoke("status", "--run-id", "evaluated", "--runs-dir", str(runs))
    said = f"  eval       eval_loss {evaluated[-1][1]:.4f} at step 9, best {best[1]:.4f} at step {best[0]}"
    assert said in status.stdout, status.stdout

    # The two parts of the generated dialogues: 10% held out, whole records, the rest trained on.
    parts = {}
    for meta in (runs / ".cache" / "tokenized").glob("*/meta.json"):
        found = json.loads(meta.read_text())
        parts[found["part"]] = found["records"]
    assert parts == {"train": 1800, "held-out": 200}, parts


def test_a_rank_killed_while_writing_a_checkpoint_resumes_to_the_same_losses_and_evaluation(evaluated, tmp_path):
    """The same job evaluated only after its last step; rank 0 SIGKILLed while the step-6 checkpoint is being
    written (after the evaluated run's step-6 evaluation, before its step-9 one). torchrun restarts the ranks, which
    find the step-3 checkpoint the latest (the step-6 one never published) and resume from it. The training losses
    are the evaluated run's to the last bit (evaluating at steps 3 and 6 moved nothing of the training), and so is
    the evaluation after the resume."""
    reference = read_jsonl(evaluated[0] / "evaluated" / "metrics.jsonl")
    args = tiny_args(tmp_path, "--run-id", "killed", *EVAL, "--eval-interval", "9")
    process = start_invoke(*args, env={STALL_ENV: "3"})
    run_dir, checkpoints = tmp_path / "killed", tmp_path / "killed" / "checkpoints"
    wait_for(lambda: latest_step(run_dir) == 3, 120, "first checkpoint published")
    wait_for(lambda: (checkpoints / ".tmp-step-00000006").is_dir(), 60, "second checkpoint being written")
    time.sleep(1)  # shards are on disk, publication is pending
    ranks = [int(line.split()[0]) for line in job_processes(f"{run_dir}/spec.json") if "trainkit.run.agent" not in line]
    assert len(ranks) == 2, ranks
    # rank 0: it publishes a checkpoint once every rank's part is on disk (the other could no longer stop that)
    main = next(pid for pid in ranks if b"\0RANK=0\0" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes())
    os.kill(main, signal.SIGKILL)
    assert process.wait(timeout=300) == 0, output(process)[-3000:]
    assert [e["step"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "resume"] == [3]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == 3 and summary["steps"] == 9
    assert not list(checkpoints.glob(".tmp-*"))
    resumed = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["loss"].hex() for r in resumed] == [r["loss"].hex() for r in reference]
    assert [(r["step"], r["eval_loss"]) for r in resumed if "eval_loss" in r] == [(9, reference[-1]["eval_loss"])]


def test_an_overfitting_run_stops_early_exports_its_best_checkpoint_which_generates_text(tmp_path):
    """A few records and many steps: the held-out loss turns, the run stops after --early-stop-patience evaluations
    without an improvement, a normal end (exit 0, no restart); the best checkpoint is kept and exported, and
    `invoke generate` on the export makes what transformers' own generate makes."""
    data = tmp_path / "few.jsonl"
    write_dialogues(data, count=12, seed=5)
    flags = ("--nproc", "2", "--dataset", str(data), "--eval-fraction", "0.25", "--eval-interval", "3")
    flags += ("--steps", "200", "--checkpoint-interval", "50", "--keep-checkpoints", "1", "--early-stop-patience", "2")
    flags += ("--lr", "0.005", "--global-batch-size", "8", "--micro-batch-size", "4", "--run-id", "early")
    done = invoke(*tiny_args(tmp_path, *flags))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "early"
    summary = json.loads((run_dir / "summary.json").read_text())
    early, best = summary["stopped_early"], summary["evaluation"]["best_step"]
    assert early["of"] == 200 and early["step"] < 200 and early["best_step"] == best < early["step"], summary
    evaluated = [r["eval_loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "eval_loss" in r]
    assert min(evaluated[-2:]) >= summary["evaluation"]["best"]  # the last two did not improve on the best
    assert summary["exported_from"] == {"checkpoint": "best", "step": best}
    assert summary["best_checkpoint"]["step"] == best and (run_dir / "checkpoints" / "best").read_text().strip() == (
        f"step-{best:08d}"
    )
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) == [
        f"step-{best:08d}",
        f"step-{early['step']:08d}",
    ]
    card = (run_dir / "model" / "README.md").read_text()
    assert f"the best checkpoint's, step {best}" in card
    events = [e["event"] for e in read_jsonl(run_dir / "events.jsonl")]
    assert events.count("start") == 1 and "resume" not in events  # no restart trained on
    status = invoke("status", "--run-id", "early", "--runs-dir", str(tmp_path))
    assert f"finished: stopped early at step {early['step']}, best at step {best}" in status.stdout, status.stdout
    again = invoke(*tiny_args(tmp_path, *flags))
    assert again.returncode == 0 and f"run early already stopped early at step {early['step']}" in again.stdout
    assert json.loads((run_dir / "summary.json").read_text()) == summary

    # `invoke generate` on the export: the tokens transformers' own generate makes with the same seed and settings,
    # from the prompt the run's dialogue-summary records framed
    dialogue = "A: The train is late again.\nB: Then we take the bus."
    settings = ("--max-new-tokens", "16", "--temperature", "0.8", "--seed", "3")
    said = invoke("generate", "--run-id", "early", "--runs-dir", str(tmp_path), "--prompt", dialogue, *settings)
    assert said.returncode == 0, said.stderr[-2000:]
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    framed = f"Summarize the following dialogue.\n\n{dialogue}\n\nSummary:\n"
    ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer(framed, add_special_tokens=False)["input_ids"]]])
    torch.manual_seed(3)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=16,
        do_sample=True,
        temperature=0.8,
        pad_token_id=tokenizer.pad_token_id,
    )
    expected = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert expected.strip() and said.stdout.strip() == expected.strip(), (said.stdout, expected)
