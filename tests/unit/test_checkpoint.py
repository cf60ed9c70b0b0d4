"""Checkpoint publishing: atomic, `latest` moves only after a complete write, keep the last K; hosts without a
shared disk publish parts that make a checkpoint together (the union a SageMaker job's start restores). Loading:
Accelerate's state and DCP's files load weights-only, and a planted pickle is refused, named, without running."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tests.helpers.guards import RefusedPopen
from tests.helpers.planted import REFUSED, Planted, plant_and_load
from training.common.checkpoint import (
    COMPLETE_MARKER,
    CheckpointManager,
    check_manifest,
    complete_steps,
    remove_partial,
)
from training.common.weights_only import FORCE_ENV, RefusedCheckpoint, load_weights_only, weights_only_loads


def manager(root: Path, keep: int = 2) -> CheckpointManager:
    return CheckpointManager(root, keep=keep, is_main=True, barrier=lambda: None)


def write_shard(directory: Path) -> None:
    (directory / "shard.bin").write_bytes(b"x" * 16)


def test_publish_moves_latest_and_prunes(tmp_path):
    ckpt = manager(tmp_path, keep=2)
    assert ckpt.latest() is None
    for step in (10, 20, 30):
        ckpt.save(step, write_shard, {"restarts": 0})
    assert ckpt.latest().name == "step-00000030"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000020", "step-00000030"]
    assert ckpt.read_state(ckpt.latest()) == {"restarts": 0, "step": 30}


def test_the_protected_step_outlives_the_rolling_window_until_another_takes_its_place(tmp_path):
    """--keep-best: the best evaluation's checkpoint is kept apart from the newest `keep`; when a later step becomes
    the best, the old one goes with the next pruning."""
    ckpt = manager(tmp_path, keep=1)
    ckpt.save(10, write_shard, {})
    ckpt.protected = {"step-00000010"}
    for step in (20, 30):
        ckpt.save(step, write_shard, {})
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000010", "step-00000030"]
    ckpt.protected = {"step-00000040"}
    ckpt.save(40, write_shard, {})
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000040"]


def test_a_write_that_dies_midway_leaves_the_previous_checkpoint(tmp_path):
    ckpt = manager(tmp_path)
    ckpt.save(10, write_shard, {})

    def dies(directory: Path) -> None:
        write_shard(directory)
        raise OSError(28, "No space left on device")  # other ranks may still be writing: the save removes nothing

    with pytest.raises(OSError):
        ckpt.save(20, dies, {})
    assert (tmp_path / ".tmp-step-00000020").is_dir()
    assert ckpt.latest().name == "step-00000010"
    ckpt.clean_partial()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000010"]


def test_once_every_rank_is_gone_the_launcher_removes_what_never_published(tmp_path):
    ckpt = manager(tmp_path)
    ckpt.save(10, write_shard, {})
    for step in (20, 30):
        (tmp_path / f".tmp-step-000000{step}").mkdir()
        write_shard(tmp_path / f".tmp-step-000000{step}")
    assert [p.name for p in remove_partial(tmp_path)] == [".tmp-step-00000020", ".tmp-step-00000030"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000010"]
    assert remove_partial(tmp_path / "missing") == []


def test_latest_pointing_at_an_incomplete_directory_falls_back(tmp_path):
    ckpt = manager(tmp_path, keep=5)
    ckpt.save(10, write_shard, {})
    ckpt.save(20, write_shard, {})
    (tmp_path / "step-00000020" / COMPLETE_MARKER).unlink()  # e.g. a torn copy
    assert ckpt.latest().name == "step-00000010"
    (tmp_path / "latest").write_text("step-00000099\n")  # pointer to something missing
    assert ckpt.latest().name == "step-00000010"


def _host(root: Path, host: str, main: bool) -> CheckpointManager:
    return CheckpointManager(
        root, keep=2, is_main=main, barrier=lambda: None, is_local_main=True, host=host, hosts=("algo-1", "algo-2")
    )


def _save_on_two_hosts(a: Path, b: Path, step: int) -> None:
    """Both hosts' local main ranks, one after the other (the barriers are each other's order here)."""
    for root, host, main in ((a, "algo-1", True), (b, "algo-2", False)):
        _host(root, host, main).save(step, lambda tmp, h=host: (tmp / f"shard-{h}.bin").write_bytes(b"x" * 8), {})


def _union(target: Path, *roots: Path) -> Path:
    """What a job's start restores onto every host: every host's uploads under one prefix."""
    for root in roots:
        shutil.copytree(root, target, dirs_exist_ok=True)
    return target


def test_hosts_without_a_shared_disk_publish_parts_that_are_whole_only_together(tmp_path):
    a, b = tmp_path / "algo-1", tmp_path / "algo-2"
    _save_on_two_hosts(a, b, 20)
    step = "step-00000020"
    # each disk holds its own part, under names only it writes; neither alone is a checkpoint
    assert sorted(p.name for p in (a / step).iterdir()) == [
        "COMPLETE.algo-1",
        "HOSTS",
        "MANIFEST.algo-1.json",
        "shard-algo-1.bin",
        "trainer_state.json",
    ]
    assert sorted(p.name for p in (b / step).iterdir()) == [
        "COMPLETE.algo-2",
        "MANIFEST.algo-2.json",
        "shard-algo-2.bin",
    ]
    assert complete_steps(a) == [] and complete_steps(b) == []
    restored = _union(tmp_path / "restored", a, b)
    assert [p.name for p in complete_steps(restored)] == [step]
    assert check_manifest(restored / step) is None
    assert _host(restored, "algo-2", False).latest() == restored / step  # main's `latest` came with the union


def test_a_part_cut_short_by_an_interruption_is_not_resumed(tmp_path):
    a, b = tmp_path / "algo-1", tmp_path / "algo-2"
    _save_on_two_hosts(a, b, 20)
    step = "step-00000020"
    shard = b / step / "shard-algo-2.bin"
    shard.write_bytes(b"x" * 3)  # the upload stopped part-way
    restored = _union(tmp_path / "cut", a, b)
    assert check_manifest(restored / step) == (
        "1 file(s) of the wrong size, e.g. shard-algo-2.bin (3 bytes, written 8)"
    )
    (restored / step / "MANIFEST.algo-2.json").unlink()  # host 2 never got its manifest out
    assert check_manifest(restored / step) == "host algo-2's part never arrived (no MANIFEST.algo-2.json)"
    (restored / step / "COMPLETE.algo-2").unlink()
    assert complete_steps(restored) == []


def test_each_host_keeps_its_newest_parts(tmp_path):
    a, b = tmp_path / "algo-1", tmp_path / "algo-2"
    for step in (10, 20, 30):
        _save_on_two_hosts(a, b, step)
    assert sorted(p.name for p in b.glob("step-*")) == ["step-00000020", "step-00000030"]
    assert (a / "latest").read_text().strip() == "step-00000030" and not (b / "latest").exists()


def test_a_host_publishes_without_a_rename_its_marker_last(tmp_path, monkeypatch):
    """SageMaker's sync is not documented to see a rename as one: every file is written under its own name."""
    from training.common import checkpoint

    def no_rename(*args, **kwargs):
        raise AssertionError("renamed")

    for module, name in ((checkpoint.os, "rename"), (checkpoint.os, "replace"), (Path, "rename"), (Path, "replace")):
        monkeypatch.setattr(module, name, no_rename)
    written, write = [], checkpoint._write_in_place
    monkeypatch.setattr(
        checkpoint, "_write_in_place", lambda path, text: written.append(path.name) or write(path, text)
    )
    step = tmp_path / "algo-1" / "step-00000020"

    def shard(directory: Path) -> None:
        assert directory == step  # the ranks write into the step's own folder
        (directory / "shard-algo-1.bin").write_bytes(b"x" * 8)

    _host(tmp_path / "algo-1", "algo-1", True).save(20, shard, {})
    assert written == ["MANIFEST.algo-1.json", "trainer_state.json", "HOSTS", "COMPLETE.algo-1", "latest"]
    assert not list(tmp_path.rglob(".*"))


def test_a_host_writes_a_step_again_over_a_restored_one_and_claims_only_what_it_wrote(tmp_path):
    a, b = tmp_path / "algo-1", tmp_path / "algo-2"
    _save_on_two_hosts(a, b, 20)
    restored = _union(tmp_path / "restored", a, b)
    step = restored / "step-00000020"
    (step / "shard-algo-2.bin").write_bytes(b"y" * 8)  # algo-2's part as S3 held it: not algo-1's to claim or delete

    def shard(directory: Path) -> None:
        assert not (directory / "COMPLETE.algo-1").exists()  # its earlier part no longer counts while it writes
        (directory / "shard-algo-1.bin").write_bytes(b"z" * 4)

    _host(restored, "algo-1", True).save(20, shard, {})
    assert json.loads((step / "MANIFEST.algo-1.json").read_text()) == {"shard-algo-1.bin": 4}
    assert (step / "shard-algo-2.bin").read_bytes() == b"y" * 8 and (step / "COMPLETE.algo-2").is_file()


def test_a_host_prunes_only_its_own_part_of_a_step_a_restore_gave_it_whole(tmp_path):
    a, b = tmp_path / "algo-1", tmp_path / "algo-2"
    for step in (10, 20):
        _save_on_two_hosts(a, b, step)
    restored = _union(tmp_path / "restored", a, b)
    _host(restored, "algo-1", True).save(30, lambda tmp: (tmp / "shard-algo-1.bin").write_bytes(b"x" * 8), {})
    assert sorted(p.name for p in (restored / "step-00000010").iterdir()) == [
        "COMPLETE.algo-2",
        "MANIFEST.algo-2.json",
        "shard-algo-2.bin",
    ]


def test_a_host_resumes_from_its_newest_complete_step_not_a_restored_latest(tmp_path):
    a, b = tmp_path / "algo-1", tmp_path / "algo-2"
    for step in (10, 20):
        _save_on_two_hosts(a, b, step)
    restored = _union(tmp_path / "restored", a, b)
    (restored / "latest").write_text("step-00000010\n")  # the main host's, as the job's start restored it
    assert _host(restored, "algo-2", False).latest() == restored / "step-00000020"


def test_a_save_after_going_back_withdraws_the_abandoned_newer_step_and_keeps_the_resumed_one(tmp_path):
    """Step 100 whole; at 200 only algo-1 marked its part before the job was lost; the restart resumed from 100. A
    save at 150 with one checkpoint kept must keep 150 (not count 200 as newer) and drop algo-1's part of 200."""
    a, b = tmp_path / "algo-1", tmp_path / "algo-2"
    _save_on_two_hosts(a, b, 100)
    _host(a, "algo-1", True).save(200, lambda tmp: (tmp / "shard-algo-1.bin").write_bytes(b"x" * 8), {})
    restored = _union(tmp_path / "restored", a, b)
    host = _host(restored, "algo-1", True)
    host.keep = 1
    host.save(150, lambda tmp: (tmp / "shard-algo-1.bin").write_bytes(b"x" * 8), {})
    assert (restored / "step-00000150" / "COMPLETE.algo-1").is_file()
    assert not (restored / "step-00000200").exists() and not (restored / "step-00000100" / "COMPLETE.algo-1").exists()


# --------------------------------------------------------------------------- loading weights-only


@pytest.fixture(scope="module")
def accelerate_state(tmp_path_factory):
    """A real `save_state` of a model, an optimizer and a registered schedule (as the recipes register theirs), one
    CPU process: (the Accelerator's TrainingState, the model, the schedule, the folder)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from training.common.lamb import Lamb
    from training.common.training_state import AcceleratorCheckpoint

    with pytest.MonkeyPatch.context() as env:
        env.setattr(subprocess, "Popen", RefusedPopen)  # set up before the layer's own guard
        accelerator = Accelerator(cpu=True)
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        model, optimizer = accelerator.prepare(model, Lamb(model.parameters(), lr=0.1))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer.optimizer, lambda step: 1.0 / (step + 1))
        accelerator.register_for_checkpointing(scheduler)
        accelerator.backward(model(torch.ones(3, 4)).sum())
        optimizer.step()
        scheduler.step()
        folder = tmp_path_factory.mktemp("accelerate") / "step-00000001"
        state = AcceleratorCheckpoint(accelerator)
        state.save(folder)
    yield state, model, scheduler, folder
    AcceleratorState._reset_state(reset_partial_state=True)


def test_accelerates_state_resumes_with_every_load_weights_only(accelerate_state):
    state, model, scheduler, folder = accelerate_state
    saved = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
    scheduler.step()
    load_weights_only(folder, state.load, state.safe_globals)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), saved, strict=True))
    assert scheduler.last_epoch == 1  # the registered schedule: Accelerate itself loads it with weights_only=False
    assert FORCE_ENV not in os.environ  # forced for the load only


@pytest.mark.parametrize("name", ["custom_checkpoint_0.pkl", "optimizer.bin", "random_states_0.pkl"])
def test_a_pickle_planted_in_accelerates_state_is_refused_by_name_and_never_runs(accelerate_state, tmp_path, name):
    """The schedule's file is the one Accelerate unpickles with weights_only=False; the RNG file one whose failure
    Accelerate would swallow (docs/security.md)."""
    state, _, _, folder = accelerate_state
    planted = plant_and_load(state, folder, tmp_path, name)
    torch.load(planted, weights_only=False)  # what resuming did before: the payload runs
    assert (tmp_path / "ran").is_dir()


def dcp_checkpoint(folder: Path) -> None:
    """DCP's own save (single process) of what an FSDP checkpoint holds: tensors and a non-tensor item."""
    import torch.distributed.checkpoint as dcp

    state = {"model": {"weight": torch.arange(6.0).reshape(2, 3)}, "optimizer": {"lr": 0.25}}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(folder))


def test_a_planted_dcp_metadata_file_is_refused_before_dcp_unpickles_it(tmp_path):
    """DCP reads `.metadata` with plain pickle.load, whatever torch's options: it is checked first."""
    import torch.distributed.checkpoint as dcp

    checkpoint = tmp_path / "step-00000002"
    dcp_checkpoint(checkpoint / "pytorch_model_fsdp_0")
    load_weights_only(checkpoint, lambda folder: None)  # DCP's own metadata passes
    (checkpoint / "pytorch_model_fsdp_0" / ".metadata").write_bytes(pickle.dumps(Planted(tmp_path / "ran")))
    with pytest.raises(RefusedCheckpoint) as refused:
        load_weights_only(checkpoint, lambda folder: pytest.fail("loaded"))
    assert str(refused.value) == f"pytorch_model_fsdp_0/.metadata {REFUSED}"
    assert not (tmp_path / "ran").exists()
    with pytest.raises(AttributeError):  # DCP's reader runs the payload (and then finds no metadata)
        dcp.FileSystemReader(checkpoint / "pytorch_model_fsdp_0").read_metadata()
    assert (tmp_path / "ran").is_dir()


def test_dcp_metadata_whose_enum_pickles_by_getattr_loads_and_no_other_getattr_does(tmp_path, monkeypatch):
    """Python 3.11.0-3.11.4 and 3.12+ (the images' Debian 3.11.2 and Ubuntu 3.12) pickle an Enum member as
    getattr(cls, name): DCP's metadata written there loads; a getattr of anything else is refused unrun."""
    import enum

    from torch.distributed.checkpoint import metadata

    checkpoint = tmp_path / "step-00000002"
    monkeypatch.setattr(enum.Enum, "__reduce_ex__", lambda self, proto: (getattr, (self.__class__, self._name_)))
    dcp_checkpoint(checkpoint / "pytorch_model_fsdp_0")
    written = (checkpoint / "pytorch_model_fsdp_0" / ".metadata").read_bytes()
    assert b"getattr" in written and b"_MEM_FORMAT_ENCODING" in written  # as the images' Pythons write it
    load_weights_only(checkpoint, lambda folder: None)
    for target, name in ((metadata._MEM_FORMAT_ENCODING, "__class__"), (pathlib.PosixPath, "__init__")):
        reduced = pickle.dumps(_GetattrOf(target, name))
        (checkpoint / "pytorch_model_fsdp_0" / ".metadata").write_bytes(reduced)
        with pytest.raises(RefusedCheckpoint, match="is not a member of DCP's enum"):
            load_weights_only(checkpoint, lambda folder: pytest.fail("loaded"))


class _GetattrOf:
    """Pickles as getattr(target, name): what a planted file would use to reach an attribute of an allowed class."""

    def __init__(self, target, name: str):
        self.target, self.name = target, name

    def __reduce__(self):
        return getattr, (self.target, self.name)


def test_dcps_non_tensor_items_load_weights_only_although_dcp_asks_for_pickle(tmp_path):
    """DCP's planner torch.loads a non-tensor item with weights_only=False: under weights_only_loads it is forced."""
    import torch.distributed.checkpoint as dcp

    dcp_checkpoint(tmp_path / "clean")
    loaded = {"model": {"weight": torch.zeros(2, 3)}, "optimizer": {"lr": 0.0}}
    with weights_only_loads():
        dcp.load(loaded, storage_reader=dcp.FileSystemReader(tmp_path / "clean"))
    assert loaded["optimizer"]["lr"] == 0.25 and torch.equal(loaded["model"]["weight"], torch.arange(6.0).reshape(2, 3))
    dcp.save({"optimizer": {"lr": Planted(tmp_path / "ran")}}, storage_writer=dcp.FileSystemWriter(tmp_path / "bad"))
    with pytest.raises(RefusedCheckpoint) as refused, weights_only_loads():
        dcp.load({"optimizer": {"lr": 0.0}}, storage_reader=dcp.FileSystemReader(tmp_path / "bad"))
    assert str(refused.value) == f"a file {REFUSED}"  # no name: the torch.load call is DCP's, the check above names
    assert not (tmp_path / "ran").exists()
