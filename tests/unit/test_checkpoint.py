"""Checkpoint publishing: atomic, `latest` moves only after a complete write, keep the last K."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.common.checkpoint import COMPLETE_MARKER, CheckpointManager


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


def test_a_write_killed_midway_leaves_the_previous_checkpoint_and_the_next_start_clears_it(tmp_path):
    ckpt = manager(tmp_path)
    ckpt.save(10, write_shard, {})
    (tmp_path / ".tmp-step-00000020").mkdir()  # what a process killed outright (SIGKILL) mid-write leaves
    write_shard(tmp_path / ".tmp-step-00000020")
    assert ckpt.latest().name == "step-00000010"
    ckpt.clean_partial()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000010"]


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_write_that_fails_removes_its_partial_checkpoint_at_once(tmp_path, error):
    """A full volume, or a stop that reaches the rank mid-save: it is alive to clean up, so it does."""
    ckpt = manager(tmp_path)
    ckpt.save(10, write_shard, {})

    def fails(directory: Path) -> None:
        write_shard(directory)
        raise error

    with pytest.raises(type(error)):
        ckpt.save(20, fails, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000010"]
    assert ckpt.latest().name == "step-00000010"


def test_latest_pointing_at_an_incomplete_directory_falls_back(tmp_path):
    ckpt = manager(tmp_path, keep=5)
    ckpt.save(10, write_shard, {})
    ckpt.save(20, write_shard, {})
    (tmp_path / "step-00000020" / COMPLETE_MARKER).unlink()  # e.g. a torn copy
    assert ckpt.latest().name == "step-00000010"
    (tmp_path / "latest").write_text("step-00000099\n")  # pointer to something missing
    assert ckpt.latest().name == "step-00000010"
