"""The val re-layout as a real process (`python -m training.vision.prep`), killed half-way and run again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.helpers.images import val_images
from tests.helpers.paths import REPO
from training.vision.layout import (
    FILE_DELAY_ENV,
    VAL_CSV_NAME,
    read_val_labels,
)


def test_relayout_interrupted_half_way_then_rerun_ends_correct(flat):
    """A real process, killed mid-way by SIGKILL, then the same command again."""
    before = {p.name: p.read_bytes() for p in val_images(flat / "val")}
    command = [sys.executable, "-m", "training.vision.prep", "--dest", str(flat)]
    process = subprocess.Popen(command, cwd=REPO, env={**os.environ, FILE_DELAY_ENV: "0.2"})
    deadline = time.monotonic() + 60
    while sum(1 for p in val_images(flat / "val") if p.parent != flat / "val") < 5:
        assert time.monotonic() < deadline and process.poll() is None, "re-layout never started moving"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    moved = [p for p in val_images(flat / "val") if p.parent != flat / "val"]
    assert 5 <= len(moved) < 20, "the kill must land half-way"
    assert len(val_images(flat / "val")) == 20
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"already in class folders {len(moved)}" in result.stdout
    after = val_images(flat / "val")
    assert {p.name: p.read_bytes() for p in after} == before
    labels = read_val_labels(flat / VAL_CSV_NAME)
    assert all(p.parent.name == labels[p.stem] for p in after)
