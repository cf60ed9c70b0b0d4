"""BERT masked-language-model pretraining (issue 31's encoder workload): 2 processes on CPU, DDP, the generated
corpus, masks drawn per step; resumed after SIGKILL with the losses of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.helpers.product import invoke, only_run_dir, read_jsonl, start_invoke
from tests.helpers.waiting import latest_step, wait_for

STEPS = 60


def args(runs, *extra: str) -> list[str]:
    # --peak-tflops: a stand-in peak, so the CPU run reports an MFU as a GPU run does (of the GPU's datasheet peak)
    return [
        "train",
        "--model",
        "bert-tiny",
        "--runs-dir",
        str(runs),
        "--metrics-port",
        "0",
        "--peak-tflops",
        "1",
        *extra,
    ]


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("bert-runs")
    result = invoke(*args(runs))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return only_run_dir(runs), result.stdout


def test_two_processes_learn_the_corpus_and_report_sequences_and_mfu(bert_run):
    run_dir, printed = bert_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["world_size"] == 2 and summary["samples"] == "sequences"
    assert summary["last_loss"] < 0.7 * summary["first_loss"], summary  # ln(261) = 5.56 at the start
    assert summary["replication"]["total_params"] == 513_416  # BertArch.parameters() for bert-tiny
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in metrics] == list(range(1, STEPS + 1))
    last = metrics[-1]
    assert last["samples_per_s"] > 0 and last["tokens_per_s"] == pytest.approx(last["samples_per_s"] * 64)
    assert 0 < last["mfu"] < 1
    assert "seq_s=" in printed


def test_sigkill_after_a_checkpoint_then_rerun_resumes_with_identical_losses(bert_run, tmp_path):
    reference = {r["step"]: r["loss"] for r in read_jsonl(bert_run[0] / "metrics.jsonl")}
    process = start_invoke(*args(tmp_path))
    run_dir = wait_for(lambda: next((p for p in tmp_path.iterdir() if p.is_dir()), None), 60, "run dir")
    wait_for(lambda: latest_step(run_dir) >= 20, 240, "the checkpoint at step 20")
    os.killpg(int((run_dir / "launcher.pid").read_text()), signal.SIGKILL)
    process.kill()
    process.wait()
    resumed_from = latest_step(run_dir)
    assert 20 <= resumed_from < STEPS

    result = invoke(*args(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == resumed_from
    resumed = {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl")}
    assert sorted(resumed) == list(range(1, STEPS + 1))
    # the masks of each step are drawn again from (seed, step, sequence): the same inputs, the same losses
    assert [f"{resumed[s]:.4f}" for s in range(resumed_from + 1, STEPS + 1)] == [
        f"{reference[s]:.4f}" for s in range(resumed_from + 1, STEPS + 1)
    ]
