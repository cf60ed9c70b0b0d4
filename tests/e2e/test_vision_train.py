"""Real 2-process DDP image classification on CPU, launched the way users launch it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.helpers.paths import HELPERS
from tests.helpers.product import invoke, only_run_dir, read_jsonl, start_invoke, torchrun
from tests.helpers.waiting import latest_step, wait_for

EPOCHS, STEPS_PER_EPOCH = 6, 10  # resnet-tiny recipe: 400 training images / global batch 40


@pytest.fixture(scope="session")
def image_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("imagenet") / "synthetic"
    result = invoke("data.synthetic-imagenet", "--dest", str(root))
    assert result.returncode == 0, result.stderr
    assert "10 classes, 500 JPEGs" in result.stdout
    return root


def vision_args(runs: Path, tree: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--model",
        "resnet-tiny",
        "--data",
        str(tree),
        "--runs-dir",
        str(runs),
        "--metrics-port",
        "0",
        *extra,
    ]


@pytest.fixture(scope="session")
def vision_run(tmp_path_factory, image_tree) -> Path:
    runs = tmp_path_factory.mktemp("vision-runs")
    result = invoke(*vision_args(runs, image_tree))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "NO_SHARD, 6 epoch(s)" in result.stdout
    return only_run_dir(runs)


def test_two_process_ddp_learns_the_classes_with_identical_replicas(vision_run):
    summary = json.loads((vision_run / "summary.json").read_text())
    metrics = read_jsonl(vision_run / "metrics.jsonl")
    assert summary["steps"] == EPOCHS * STEPS_PER_EPOCH and summary["world_size"] == 2
    assert summary["last_loss"] < 0.6 * summary["first_loss"], summary
    final = summary["final_eval"]
    assert final["val_images"] == 100 and final["val_top1"] >= 0.5, final  # chance is 0.1
    assert final["val_top5"] >= final["val_top1"]
    # DDP averaged the gradients: both ranks hold bit-identical weights (checked in the job every epoch).
    digests = summary["replica_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert summary["replication"]["strategy"] == "NO_SHARD" and summary["classes"] == 10
    assert summary["samples"] == "images" and summary["samples_per_s_median"] > 0
    assert summary["epoch_time_s_median"] > 0 and summary["data_wait_s_median"] is not None
    epoch_ends = [r for r in metrics if "val_top1" in r]
    assert [r["step"] for r in epoch_ends] == [STEPS_PER_EPOCH * e for e in range(1, EPOCHS + 1)]
    assert epoch_ends[-1]["val_top1"] > epoch_ends[0]["val_top1"] or epoch_ends[0]["val_top1"] == 1.0
    assert [r["step"] for r in metrics] == list(range(1, 61))
    checkpoints = sorted(p.name for p in (vision_run / "checkpoints").glob("step-*"))
    assert checkpoints == ["step-00000050", "step-00000060"]  # one per epoch end, the last two kept
    assert (vision_run / "checkpoints" / "latest").read_text().strip() == "step-00000060"


def test_sigkill_mid_epoch_then_rerun_resumes_with_identical_losses(vision_run, image_tree, tmp_path):
    """Checkpoints every 7 steps (mid-epoch) as well as at epoch ends; killed, re-run, compared."""
    args = vision_args(tmp_path, image_tree, "--checkpoint-interval", "7")
    process = start_invoke(*args)
    run_dir = wait_for(lambda: next((p for p in tmp_path.iterdir() if p.is_dir()), None), 60, "run dir")
    wait_for(lambda: latest_step(run_dir) >= 14, 240, "the checkpoint at step 14")
    os.killpg(int((run_dir / "launcher.pid").read_text()), signal.SIGKILL)
    process.kill()
    process.wait()
    resumed_from = latest_step(run_dir)
    assert 14 <= resumed_from < 60
    assert resumed_from % STEPS_PER_EPOCH, f"killed after the checkpoint at {resumed_from}: meant to land mid-epoch"

    result = invoke(*args)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == resumed_from and summary["restarts"] == 1
    resumed = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl")}
    reference = {r["step"]: r for r in read_jsonl(vision_run / "metrics.jsonl")}
    assert sorted(resumed) == list(range(1, 61))
    for step in range(resumed_from + 1, 61):
        assert abs(resumed[step]["loss"] - reference[step]["loss"]) <= 1e-4, (step, resumed[step], reference[step])
    assert resumed[60]["val_top1"] == reference[60]["val_top1"]
    assert summary["replica_digests"] == json.loads((vision_run / "summary.json").read_text())["replica_digests"]


def test_replica_check_stops_ranks_that_train_alone():
    result = torchrun(2, str(HELPERS / "vision_replica_check.py"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("refused: data-parallel replicas hold different weights") == 2


def test_synthetic_device_input_measures_compute_without_reading_images(tmp_path):
    result = invoke("train", "--model", "resnet-tiny", "--synthetic", "--steps", "4", "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "4 steps" in result.stdout
    run_dir = only_run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["synthetic"] is True and summary["final_eval"] is None and summary["classes"] == 10
    assert summary["steps"] == 4 and summary["samples_per_s_median"] > 0
    assert not (run_dir / "data").exists()  # no image tree was written or read


def test_default_dataset_generates_a_tree_in_the_run(tmp_path):
    result = invoke("train", "--model", "resnet-tiny", "--epochs", "1", "--runs-dir", str(tmp_path), "--metrics-port=0")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    run_dir = only_run_dir(tmp_path)
    assert len(list((run_dir / "data" / "imagenet" / "train").iterdir())) == 10
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS_PER_EPOCH and summary["final_eval"]["val_images"] == 100
