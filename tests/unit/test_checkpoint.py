"""Checkpoint publishing: atomic, `latest` moves only after a complete write, keep the last K."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.common.checkpoint import COMPLETE_MARKER, CheckpointManager, remove_partial


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
