"""Held-out evaluation of a real 2-process FSDP run (issue 52), launched as users launch it and judged by what it
leaves: the held-out records are never trained on, the evaluation loss falls, the figures are where users look, and
evaluating changes nothing of the training (its losses bit for bit)."""

from __future__ import annotations

import json

from tests.helpers.product import invoke, read_jsonl, tiny_args

EVAL = ("--eval-fraction", "0.1", "--steps", "12", "--checkpoint-interval", "4")


def test_held_out_records_are_evaluated_at_every_checkpoint_and_evaluating_moves_no_training_loss(tmp_path):
    runs = tmp_path / "runs"
    done = invoke(*tiny_args(runs, "--nproc", "2", "--run-id", "evaluated", *EVAL))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = runs / "evaluated"
    records = read_jsonl(run / "metrics.jsonl")
    evaluated = [(r["step"], r["eval_loss"], r["eval_ppl"]) for r in records if "eval_loss" in r]
    assert [step for step, _, _ in evaluated] == [4, 8, 12], evaluated  # at each checkpoint, the last included
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
    said = f"  eval       eval_loss {evaluated[-1][1]:.4f} at step 12, best {best[1]:.4f} at step {best[0]}"
    assert said in status.stdout, status.stdout

    # The two parts of the generated dialogues: 10% held out, whole records, the rest trained on.
    parts = {}
    for meta in (runs / ".cache" / "tokenized").glob("*/meta.json"):
        found = json.loads(meta.read_text())
        parts[found["part"]] = found["records"]
    assert parts == {"train": 1800, "held-out": 200}, parts

    # The same run with evaluation off: the same data, the same training losses, to the last bit.
    plain = invoke(*tiny_args(runs, "--nproc", "2", "--run-id", "plain", *EVAL, "--eval-interval", "0"))
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    without = read_jsonl(runs / "plain" / "metrics.jsonl")
    assert not any("eval_loss" in r for r in without)
    assert [r["loss"].hex() for r in without] == [r["loss"].hex() for r in records]
    assert "evaluation" not in json.loads((runs / "plain" / "summary.json").read_text())
