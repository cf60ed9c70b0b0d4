"""The disk a run writes, in-process: the estimate, and the checks that refuse a run (local disk, FSx on EKS)
before anything is written. Through the command line: tests/integration/test_storage_cli.py; the estimate
against what a real run wrote: tests/e2e/test_storage_runs.py."""

from __future__ import annotations

import shutil

import pytest

from trainkit.backends import job_from_flags as build_spec
from trainkit.backends.eks import preflight
from trainkit.errors import SpecError
from trainkit.infra import outputs
from trainkit.job.models import get_model
from trainkit.run.storage import GIB, check_fsx_capacity, fsx_capacity_for, saves, storage_need


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


def test_zero_1_checkpoints_also_hold_the_fp32_master_weights():
    """DeepSpeed ZeRO-1 saves the module's weights, its fp32 master copy and the moments (training/common/zero.py):
    16 bytes a parameter under LAMB, where DDP's checkpoint holds 12."""
    bert = get_model("bert-tiny")
    zero = storage_need(build_spec({"model": "bert-tiny"}), bert)  # the recipe's sharding: ZERO_1
    ddp = storage_need(build_spec({"model": "bert-tiny", "sharding": "NO_SHARD"}), bert)
    assert (zero.checkpoint_bytes, ddp.checkpoint_bytes) == (16 * 513_416, 12 * 513_416)


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
    outputs.save_outputs({"fsx_storage_capacity_gib": 1200, "gpu_instance_type": "p5.48xlarge"})
    with pytest.raises(SpecError, match=r"holds 1,200 GiB in all"):
        preflight.check_storage(spec)
    preflight.check_storage(build_spec({"target": "eks", "model": "llama2-13b"}))  # 485 GiB: fits


def test_the_checks_leave_the_disk_alone(tmp_path):
    """The local check reads free space at the nearest existing parent of a run folder not made yet."""
    spec = build_spec({"model": "llama2-tiny", "runs_dir": str(tmp_path / "a" / "b")})
    from trainkit.run.storage import check_free_space

    assert check_free_space(spec, get_model("llama2-tiny")).total < shutil.disk_usage(tmp_path).free
    assert not (tmp_path / "a").exists()


def test_the_watchdogs_checkpoint_allowance_comes_from_the_bytes_at_the_fsx_throughput(tmp_path, monkeypatch):
    """llama2-70b on the 4,800 GiB FSx at 250 MB/s per TiB: 827.7 GB a checkpoint (12 bytes a parameter), at
    1,172 MB/s x 1.5 (18 min); the export phase (the last save and the 276 GB export) longer. The launcher says both
    at start."""
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))
    outputs.save_outputs(
        {"fsx_storage_capacity_gib": 4800, "fsx_throughput_per_tib": 250, "gpu_instance_type": "p5.48xlarge"}
    )
    spec = build_spec({"target": "eks", "model": "llama2-70b", "nodes": 16})
    c = spec.checkpointing
    assert c.storage_mb_s == pytest.approx(1171.875)
    assert c.phase_bytes["checkpoint"] == storage_need(spec, get_model("llama2-70b")).checkpoint_bytes
    assert (
        c.phase_bytes["export"]
        == c.phase_bytes["checkpoint"] + 4 * get_model("llama2-70b").arch.truncated(None).parameters()
    )
    (note,) = [n for n in spec.run.notes if n.startswith("stall watchdog: ")]
    assert note == (
        "stall watchdog: checkpoint allowance 18 min: 827.7 GB at 1,172 MB/s x 1.5; "
        "export allowance 24 min: 1,103.6 GB at 1,172 MB/s x 1.5"
    )
    declared = build_spec({"target": "eks", "model": "llama2-70b", "nodes": 16, "storage_mb_s": 500})
    assert "checkpoint allowance 41 min: 827.7 GB at 500 MB/s x 1.5" in " ".join(declared.run.notes)
    off = build_spec({"target": "eks", "model": "llama2-70b", "nodes": 16, "stall_timeout": 0})
    assert not any(n.startswith("stall watchdog") for n in off.run.notes)


def test_a_local_disk_is_measured_only_where_a_checkpoint_could_outlast_the_least_allowance(tmp_path, monkeypatch):
    from trainkit.backends.local import backend as local

    measured = []
    monkeypatch.setattr(local, "measure_write_mb_s", lambda folder: measured.append(folder) or 180.04)
    tiny = build_spec({"model": "llama2-tiny", "runs_dir": str(tmp_path)})
    assert measured == [] and tiny.checkpointing.storage_mb_s is None
    assert not any(n.startswith("stall watchdog") for n in tiny.run.notes)  # the least allowance: nothing to say
    big = build_spec({"model": "llama2-13b", "runs_dir": str(tmp_path), "nproc": 1})
    assert len(measured) == 1 and big.checkpointing.storage_mb_s == 180.0
    assert "checkpoint allowance 22 min: 156.2 GB at 180 MB/s x 1.5" in big.run.notes[-1]


def test_measuring_a_disk_writes_and_removes_one_file(tmp_path):
    from trainkit.run.storage import measure_write_mb_s

    assert measure_write_mb_s(tmp_path / "not" / "yet", size=4 * 2**20) > 0
    assert list(tmp_path.iterdir()) == []


def test_on_sagemaker_each_host_writes_its_part_of_a_checkpoint_and_the_export_is_one_hosts():
    """16 hosts, each with its own volume at the gp3 baseline: a 70B checkpoint is 16 writes of 51.7 GB at once
    (under the 10 min floor), while the export adds rank 0's 275.9 GB alone, at one volume's rate."""
    spec = build_spec({"target": "sagemaker", "model": "llama2-70b", "nodes": 16})
    c = spec.checkpointing
    assert (c.storage_hosts, c.storage_mb_s) == (16, 131.1)
    (note,) = [n for n in spec.run.notes if n.startswith("stall watchdog: ")]
    assert note == (
        "stall watchdog: checkpoint allowance 10 min: at least 600 s; "
        "export allowance 62 min: 827.7 GB over 16 hosts and 275.9 GB on one, at 131.1 MB/s each x 1.5"
    )
    from trainkit.run.watchdog import budgets

    alone = budgets(None, c.phase_bytes, c.storage_mb_s)  # as one shared volume: 16 times the checkpoint's time
    assert alone["checkpoint"].seconds > 15 * 600


def test_a_lora_checkpoint_holds_the_adapters_and_their_moments_and_the_merged_export_the_whole_model_too():
    """LoRA (training/common/training_state.py AdapterCheckpoint): 12 bytes an adapter parameter, nothing of the
    frozen base; the adapter export 4 bytes an adapter parameter, and --export merged adds the whole model's."""
    entry = get_model("llama2-7b")
    flags = {"model": "llama2-7b", "init": "pretrained", "lora_rank": 8}
    full = storage_need(build_spec({"model": "llama2-7b"}), entry)
    adapter = storage_need(build_spec(flags), entry)
    merged = storage_need(build_spec({**flags, "export": "merged"}), entry)
    trained = 19_988_480  # rank 8 on every linear layer: PEFT's own count (tests/unit/test_plan.py)
    assert adapter.trained == merged.trained == trained and full.trained is None
    assert adapter.checkpoint_bytes == 12 * trained == merged.checkpoint_bytes
    assert full.checkpoint_bytes == 12 * full.parameters == 12 * adapter.parameters
    assert (adapter.export_bytes, merged.export_bytes) == (4 * trained, 4 * trained + full.export_bytes)
    assert "20.0 M of them trained" in adapter.describe()
