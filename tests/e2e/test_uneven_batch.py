"""A global batch that does not divide the world (an elastic range at a size below its largest) trains
exactly as an even split does: ranks take shares one apart, a rank short of a micro batch runs a stand-in
counted zero, and the loss is normalised by the whole global batch.

The session's `make train MODEL=llama2-tiny` run (2 processes, 16 sequences: 8 each) is the reference; its
prepared run folder is copied and its first steps re-run by 3 processes with a micro batch of 1: shares
6/5/5 over 6 micro steps, so ranks 1 and 2 each run one stand-in. The launcher would pick that split
only after an elastic job shrank; the workers are started directly here (torchrun, the same module)."""

from __future__ import annotations

import json
import shutil

from tests.helpers.product import read_jsonl, torchrun

STEPS = 3  # inside the recipe's 6 warmup steps: the schedule does not depend on the run's length


def test_three_ranks_with_uneven_shares_match_two_even_ones(tiny_run, tmp_path):
    run = tmp_path / "uneven"
    outputs = ("checkpoints", "logs", "model", "metrics.jsonl", "events.jsonl", "summary.json", "*.pid")
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns(*outputs))  # the prepared inputs stay
    spec = json.loads((tiny_run / "spec.json").read_text())
    assert spec["parallelism"]["nproc"] == 2 and spec["optimisation"]["global_batch_size"] == 16
    spec["parallelism"]["nproc"] = 3
    spec["optimisation"].update(micro_batch_size=1, steps=STEPS, global_batch_derived=True)
    spec["run"].update(run_id="uneven", runs_dir=str(tmp_path), metrics_port=0)
    (run / "spec.json").write_text(json.dumps(spec))
    result = torchrun(3, "-m", "training", "--spec", str(run / "spec.json"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    uneven = read_jsonl(run / "metrics.jsonl")
    even = read_jsonl(tiny_run / "metrics.jsonl")[:STEPS]
    assert [r["step"] for r in uneven] == [1, 2, 3]
    for a, b in zip(even, uneven, strict=True):
        assert abs(a["loss"] - b["loss"]) <= 1e-5, (a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * max(1.0, a["grad_norm"]), (a, b)
