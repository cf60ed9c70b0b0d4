"""Loader workers never outlive the process that owns them, however it ends (finished or killed), and leave a stop
signal to it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.paths import HELPERS, REPO
from tests.helpers.waiting import wait_for
from training.vision.synthetic import SyntheticTree, write_tree


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return write_tree(tmp_path_factory.mktemp("tree"), SyntheticTree(classes=2, per_class=4, val_per_class=4))


@pytest.mark.parametrize("how", ["exit", "kill", "term"])
def test_a_loader_worker_exits_with_its_trainer(tree, how):
    result = subprocess.run(
        [sys.executable, str(HELPERS / "loader_owner.py"), str(tree), how],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,  # its own process group, which `term` signals
    )
    workers = [int(pid) for pid in result.stdout.split()]
    assert len(workers) == 1, result.stdout + result.stderr
    if how == "term":  # a stop signalled to the whole group is the trainer's to handle: the worker kept serving
        assert result.returncode == 0 and "served after SIGTERM" in result.stderr, result.stderr
    # torch's worker loop checks its parent every 5 s; a worker whose parent is not the trainer never stops.
    wait_for(lambda: not any(map(alive, workers)), 30, f"loader worker {workers} to exit ({how})", interval=0.5)
