"""Real 2-process DDP image classification on CPU, launched the way users launch it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.paths import HELPERS
from tests.helpers.product import (
    invoke,
    killed_after_checkpoint,
    only_run_dir,
    read_jsonl,
    torchrun,
)

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
    best = max(epoch_ends, key=lambda r: r["val_top1"])["step"]  # the first of equals: a tie is no improvement
    assert summary["best_checkpoint"]["step"] == best
    # one per epoch end, the last two kept, and the best top-1's (--keep-best, on where the run evaluates)
    assert checkpoints == sorted({"step-00000050", "step-00000060", f"step-{best:08d}"})
    assert (vision_run / "checkpoints" / "best").read_text().strip() == f"step-{best:08d}"
    assert (vision_run / "checkpoints" / "latest").read_text().strip() == "step-00000060"


def test_sigkill_mid_epoch_then_rerun_resumes_with_identical_losses(vision_run, image_tree, tmp_path):
    """Checkpoints every 7 steps (mid-epoch) as well as at epoch ends; killed, re-run, compared."""
    args = vision_args(tmp_path, image_tree, "--checkpoint-interval", "7")
    _launcher, run_dir, resumed_from = killed_after_checkpoint(tmp_path, 14, *args)
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


def train_tiny(runs: Path, *flags: str) -> tuple[Path, str]:
    """`invoke train --model resnet-tiny <flags>` into `runs`: (its run folder, what it printed)."""
    result = invoke("train", "--model", "resnet-tiny", "--runs-dir", str(runs), "--metrics-port=0", *flags)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return only_run_dir(runs), result.stdout


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl")]


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory) -> Path:
    """Four steps on device-made tensors, the plain paths (fp32, contiguous NCHW on CPU)."""
    run_dir, printed = train_tiny(tmp_path_factory.mktemp("synthetic"), "--synthetic", "--steps", "4")
    assert "4 steps" in printed
    return run_dir


@pytest.fixture(scope="module")
def one_epoch_run(tmp_path_factory) -> Path:
    """One epoch of the default dataset (a JPEG tree generated in the run), the default loader."""
    return train_tiny(tmp_path_factory.mktemp("one-epoch"), "--epochs", "1")[0]


def test_synthetic_device_input_measures_compute_without_reading_images(synthetic_run):
    summary = summary_of(synthetic_run)
    assert summary["synthetic"] is True and summary["final_eval"] is None and summary["classes"] == 10
    assert summary["steps"] == 4 and summary["samples_per_s_median"] > 0
    assert not (synthetic_run / "data").exists()  # no image tree was written or read
    taken = {"channels_last": False, "input_channels_last": False, "forward_dtype": "float32", "loader": None}
    assert summary["fast_paths"] == taken


def test_default_dataset_generates_a_tree_in_the_run(one_epoch_run):
    assert len(list((one_epoch_run / "data" / "imagenet" / "train").iterdir())) == 10
    summary = summary_of(one_epoch_run)
    assert summary["steps"] == STEPS_PER_EPOCH and summary["final_eval"]["val_images"] == 100
    loader = {"loader_workers": 1, "pin_memory": False, "persistent_workers": True, "prefetch_factor": 4}
    assert summary["fast_paths"]["loader"] == loader  # CPU defaults: no pinning (no GPU to copy to)


# The vision fast paths (docs/performance.md), each against the plain run above, read back from the run.


def test_channels_last_is_taken_and_computes_the_same_losses(synthetic_run, tmp_path):
    run_dir, _ = train_tiny(tmp_path, "--synthetic", "--steps", "4", "--channels-last", "true")
    taken = summary_of(run_dir)["fast_paths"]
    assert taken["channels_last"] is True and taken["input_channels_last"] is True  # every conv weight, the batch
    # Other convolution kernels, the same arithmetic: rounding only.
    assert losses(run_dir) == pytest.approx(losses(synthetic_run), abs=1e-4)


def test_bf16_autocast_is_taken_and_trains_within_its_rounding(synthetic_run, tmp_path):
    run_dir, _ = train_tiny(tmp_path, "--synthetic", "--steps", "4", "--precision", "bf16")
    summary = summary_of(run_dir)
    assert summary["precision"] == "bf16" and summary["fast_paths"]["forward_dtype"] == "bfloat16"
    plain = losses(synthetic_run)
    assert losses(run_dir) == pytest.approx(plain, abs=2e-2) and losses(run_dir) != plain


def test_loader_settings_and_evaluating_at_an_interval_leave_every_loss_unchanged(one_epoch_run, tmp_path):
    """Other loader settings, and evaluation every --eval-interval steps instead of at the epoch's end: the same
    training losses, and the same evaluation of the last step's weights."""
    flags = ("--loader-workers", "2", "--persistent-workers", "false", "--prefetch-factor", "2", "--eval-interval", "3")
    run_dir, printed = train_tiny(tmp_path, "--epochs", "1", *flags)
    summary = summary_of(run_dir)
    loader = {"loader_workers": 2, "pin_memory": False, "persistent_workers": False, "prefetch_factor": 2}
    assert summary["fast_paths"]["loader"] == loader
    # Augmentation is seeded per (epoch, image): the same pixels whichever worker makes them, and when.
    assert losses(run_dir) == losses(one_epoch_run)
    assert summary["final_eval"] == summary_of(one_epoch_run)["final_eval"]
    evaluated = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "val_top1" in r]
    assert evaluated == sorted({*range(3, STEPS_PER_EPOCH + 1, 3), STEPS_PER_EPOCH}), evaluated
    assert "eval at step 3: val_top1=" in printed and summary["evaluation"]["evaluations"] == len(evaluated)
