"""BERT masked-language-model pretraining (issue 31's encoder workload): 2 processes on CPU, DeepSpeed ZeRO stage 1
(the recipe's sharding), the generated corpus, masks drawn per step; each rank's checkpoint holds half of the
optimizer state, LAMB on ZeRO-1's slices takes DDP's steps, and a SIGKILL after a checkpoint resumes with the losses
(and held-out evaluations) of an uninterrupted run when the same command continues it on one process; a ZeRO-1
checkpoint resumes at another world size through DeepSpeed's universal checkpoint."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from tests.helpers.paths import REPO
from tests.helpers.product import (
    invoke,
    killed_after_checkpoint,
    only_run_dir,
    output,
    read_jsonl,
    start_invoke,
)

STEPS = 60
DROPOUT_NOISE = 0.02
"""Twice the largest per-step loss difference measured between uninterrupted 1- and 2-process runs of the job."""


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
        "--eval-fraction",  # 10% of the corpus held out, evaluated at each checkpoint (steps 20, 40 and 60)
        "0.1",
        *extra,
    ]


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    """The recipe's run (ZERO_1) and, at the same time, the same job under DDP (NO_SHARD)."""
    runs, ddp_runs = tmp_path_factory.mktemp("bert-runs"), tmp_path_factory.mktemp("bert-ddp")
    ddp = start_invoke(*args(ddp_runs, "--sharding", "NO_SHARD"))
    # Where DeepSpeed would compile an op it lacks (torch's JIT extensions): `make setup` built its CPU one already.
    extensions = tmp_path_factory.mktemp("torch-extensions")
    result = invoke(*args(runs), env={"TORCH_EXTENSIONS_DIR": str(extensions)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert ddp.wait(timeout=600) == 0, output(ddp)[-3000:]
    return only_run_dir(runs), result.stdout, only_run_dir(ddp_runs), extensions


def test_two_processes_learn_the_corpus_and_report_sequences_and_mfu(bert_run):
    run_dir, printed = bert_run[:2]
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
    evaluated = [(r["step"], r["eval_loss"]) for r in metrics if "eval_loss" in r]
    assert [step for step, _ in evaluated] == [20, 40, 60] and evaluated[-1][1] < evaluated[0][1], evaluated
    assert summary["evaluation"]["best_step"] == 60 and f"eval at step 60: eval_loss={evaluated[-1][1]:.4f}" in printed


def test_sigkill_after_a_checkpoint_then_the_same_command_on_one_process_continues_the_run(bert_run, tmp_path):
    """A machine lost after a checkpoint of a 2-process run; the same command with `--nproc 1` (the capacity left)
    continues it: the same run (its derived id does not hang on the size), its ZeRO-1 checkpoint of 2 ranks loaded
    through DeepSpeed's universal checkpoint (elementwise: test_a_zero_1_checkpoint_resumes_at_another_world_size),
    the schedule where it was (every learning rate the uninterrupted run's). The masks of each step are drawn
    again from (seed, step, sequence) and the global batch is the run's, but dropout draws its masks from each rank's
    own random stream, so on another number of ranks the losses differ by its noise: uninterrupted 1- and 2-process
    runs of this job differed by at most 0.0093 a step here (2026-11-28). The same size resumes bit for bit:
    tests/e2e/test_aws_batch_runs.py."""
    reference = {r["step"]: r for r in read_jsonl(bert_run[0] / "metrics.jsonl")}
    _launcher, run_dir, resumed_from = killed_after_checkpoint(tmp_path, 20, *args(tmp_path))
    assert 20 <= resumed_from < STEPS

    result = invoke(*args(tmp_path), "--nproc", "1")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"note: resuming step {resumed_from} of a 2-process run on 1 process\n" in result.stdout
    assert "converting it to DeepSpeed's universal checkpoint" in result.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == resumed_from and summary["world_size"] == 1
    resumed = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl")}
    assert sorted(resumed) == list(range(1, STEPS + 1))
    for step in range(resumed_from + 1, STEPS + 1):
        now, then = resumed[step], reference[step]
        assert now["lr"] == then["lr"] and abs(now["loss"] - then["loss"]) <= DROPOUT_NOISE, (step, now, then)
        # the held-out masks are the same at every evaluation: only the weights' dropout noise moves the figure
        assert ("eval_loss" in now) == ("eval_loss" in then)
        assert abs(now.get("eval_loss", 0) - then.get("eval_loss", 0)) <= DROPOUT_NOISE, (step, now, then)


def test_each_rank_checkpoints_half_of_the_optimizer_state(bert_run):
    run_dir = bert_run[0]
    assert not any(bert_run[3].iterdir())  # no run compiles DeepSpeed's communication op: the set-up did, once
    assert json.loads((run_dir / "summary.json").read_text())["replication"]["strategy"] == "ZERO_1"
    zero = run_dir / "checkpoints" / "step-00000060" / "zero"
    held = []
    for rank in (0, 1):
        saved = torch.load(zero / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", weights_only=False)
        state = saved["optimizer_state_dict"]
        masters = sum(t.numel() for t in state["single_partition_of_fp32_groups"])
        moments = [
            s[k].numel() for s in state["base_optimizer_state"]["state"].values() for k in ("exp_avg", "exp_avg_sq")
        ]
        assert sum(moments) == 2 * masters  # LAMB's two moments, of this rank's slice only
        held.append(masters)
    total = 513_416  # BertArch.parameters() for bert-tiny
    assert all(0.49 * total <= h <= 0.51 * total for h in held), held
    assert total <= sum(held) <= total + 64  # the slices cover the model once (DeepSpeed pads to the world size)


def test_lamb_on_zero_1_slices_takes_the_steps_of_lamb_under_ddp(bert_run):
    """Trust ratios from whole-parameter norms: ZeRO-1's sliced LAMB and DDP's LAMB on whole parameters (fp32 on CPU)
    give the same losses, up to the order in which the reductions add."""
    zero_losses = [r["loss"] for r in read_jsonl(bert_run[0] / "metrics.jsonl")]
    ddp_losses = [r["loss"] for r in read_jsonl(bert_run[2] / "metrics.jsonl")]
    assert json.loads((bert_run[2] / "summary.json").read_text())["replication"]["strategy"] == "NO_SHARD"
    assert zero_losses == pytest.approx(ddp_losses, rel=1e-4)


def test_a_zero_1_checkpoint_resumes_at_another_world_size(bert_run, tmp_path):
    """An elastic job that comes back with another number of ranks: the checkpoint of 2 is converted to DeepSpeed's
    universal form and 3 ranks take their new slices of it, every master weight and moment the same as saved
    (tests/helpers/zero_reload.py compares them); the conversion is removed once loaded."""
    run_dir = shutil.copytree(bert_run[0], tmp_path / "run")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3"]
    done = subprocess.run(
        [*command, str(REPO / "tests/helpers/zero_reload.py"), str(run_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert report == {"step": STEPS, "writers": 2, "world": 3, "compared": 513_416}
    assert "converting it to DeepSpeed's universal checkpoint" in done.stdout
    assert not (run_dir / "checkpoints" / ".universal").exists()
