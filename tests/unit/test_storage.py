"""The disk a run writes: the estimate against what a real run wrote, and the checks that refuse a run
(local disk, FSx on EKS) before anything is written."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers.product import invoke
from training.common.job import Job
from trainkit import cluster
from trainkit.backends import job_from_flags as build_spec
from trainkit.backends.eks import preflight
from trainkit.errors import SpecError
from trainkit.job.models import get_model
from trainkit.storage import GIB, check_fsx_capacity, fsx_capacity_for, saves, storage_need


def folder_bytes(path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_the_estimate_matches_what_a_real_run_wrote(tiny_run):
    spec = Job.from_dict(json.loads((tiny_run / "spec.json").read_text()))
    need = storage_need(spec, get_model(spec.model.name))
    checkpoints = sorted((tiny_run / "checkpoints").glob("step-*"))
    assert checkpoints
    for checkpoint in checkpoints:
        # Parameters and AdamW moments in fp32; the rest (RNG states, metadata) is a few kilobytes.
        assert need.checkpoint_bytes <= folder_bytes(checkpoint) <= need.checkpoint_bytes * 1.05 + 200_000
    weights = sum(p.stat().st_size for p in (tiny_run / "model").glob("*.safetensors"))
    assert need.export_bytes <= weights <= need.export_bytes * 1.01 + 100_000


@pytest.mark.parametrize(
    ("steps", "interval", "expected"), [(1000, 200, 5), (200, 200, 1), (201, 200, 2), (10, 0, 1), (None, 5, None)]
)
def test_saves_count_every_interval_and_the_last_step(steps, interval, expected):
    assert saves(steps, interval) == expected


def test_the_peak_is_keep_plus_the_one_being_written_less_what_is_already_there():
    entry = get_model("llama2-7b")
    spec = build_spec({"model": "llama2-7b", "steps": 1000, "checkpoint_interval": 100, "keep_checkpoints": 2})
    assert storage_need(spec, entry).checkpoints == 3
    assert storage_need(spec, entry, existing=2).checkpoints == 1  # a resumed run: two are on disk already
    short = build_spec({"model": "llama2-7b", "steps": 50, "checkpoint_interval": 100, "keep_checkpoints": 2})
    assert storage_need(short, entry).checkpoints == 1  # only the final save
    # Vision: no export; SGD keeps one fp32 momentum, LAMB two.
    vision = get_model("resnet50")
    sgd = storage_need(build_spec({"model": "resnet50", "optimizer": "sgd"}), vision)
    lamb = storage_need(build_spec({"model": "resnet50", "optimizer": "lamb"}), vision)
    assert (sgd.export_bytes, sgd.checkpoint_bytes, lamb.checkpoint_bytes) == (0, 8 * 25_557_032, 12 * 25_557_032)


def test_a_run_that_cannot_fit_on_the_local_disk_is_refused_before_anything_is_written(tmp_path):
    runs = tmp_path / "runs"
    # 51 checkpoints of a 70B model (~42 TB) fit on no disk this suite runs on.
    args = ["--model", "llama2-70b", "--init", "random", "--steps", "10000", "--checkpoint-interval", "1"]
    result = invoke("train", *args, "--keep-checkpoints", "50", "--runs-dir", str(runs), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "51 checkpoint(s) of 827.7 GB" in result.stderr and "GB free" in result.stderr, result.stderr
    assert "--keep-checkpoints, now 50" in result.stderr and "--runs-dir" in result.stderr
    assert not runs.exists() or not any(runs.iterdir())


def test_fsx_capacity_is_rounded_to_what_the_infra_stack_accepts():
    wanted = {10: 1200, 1200: 1200, 1201: 2400, 2400: 2400, 2401: 4800, 5000: 7200}
    assert {gib: fsx_capacity_for(gib * GIB) for gib in wanted} == wanted


def test_llama2_70b_with_three_checkpoints_does_not_fit_the_default_fsx():
    entry = get_model("llama2-70b")
    spec = build_spec({"target": "eks", "model": "llama2-70b"})
    with pytest.raises(
        SpecError, match=r"2,570 GiB and the FSx file system holds 2,400 GiB.*fsx_storage_capacity_gib = 4800"
    ):
        check_fsx_capacity(spec, entry, 2400)
    fewer = build_spec({"target": "eks", "model": "llama2-70b", "keep_checkpoints": 1})
    assert check_fsx_capacity(fewer, entry, 2400).checkpoints == 2


def test_the_eks_preflight_reads_the_capacity_make_up_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))
    spec = build_spec({"target": "eks", "model": "llama2-70b"})
    preflight.check_storage(spec)  # nothing recorded yet: nothing to compare against
    cluster.save_outputs({"fsx_storage_capacity_gib": 1200, "gpu_instance_type": "p5.48xlarge"})
    with pytest.raises(SpecError, match=r"holds 1,200 GiB in all"):
        preflight.check_storage(spec)
    preflight.check_storage(build_spec({"target": "eks", "model": "llama2-13b"}))  # 485 GiB: fits


def test_the_checks_leave_the_disk_alone(tmp_path):
    """The local check reads free space at the nearest existing parent of a run folder not made yet."""
    spec = build_spec({"model": "llama2-tiny", "runs_dir": str(tmp_path / "a" / "b")})
    from trainkit.storage import check_free_space

    assert check_free_space(spec, get_model("llama2-tiny")).total < shutil.disk_usage(tmp_path).free
    assert not (tmp_path / "a").exists()
