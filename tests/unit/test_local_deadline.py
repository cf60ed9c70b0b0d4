"""The one line of a local run stopped at its --max-runtime deadline, in-process, for the stops a real run rarely
shows (tests/e2e/test_local_control.py runs one): no time left for a checkpoint, no checkpoint at all, a script's."""

from __future__ import annotations

import json

import pytest

from tests.helpers.jobs import build_spec
from trainkit.backends.local.deadline import deadline_reason


@pytest.fixture(autouse=True)
def no_local_services(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))


def stopped_run(tmp_path, stop: dict | None, published: tuple[int, ...] = ()):
    job = build_spec({"runs_dir": str(tmp_path / "runs"), "run_id": "dl", "max_runtime": "25"}).job
    for step in published:
        folder = job.run_dir / "checkpoints" / f"step-{step:08d}"
        folder.mkdir(parents=True)
        (folder / "COMPLETE").write_text("")
    job.run_dir.mkdir(parents=True, exist_ok=True)
    events = [{"event": "stop", "time": 50.0, "step": 9, "checkpoint": 9, "signal": 15}]  # an earlier launch's
    if stop is not None:
        events.append({"event": "stop", "time": 100.0, "signal": 15, **stop})
    text = "".join(json.dumps(e) + "\n" for e in events) + '{"event": "sto'  # a line a kill cut short
    (job.run_dir / "events.jsonl").write_text(text)
    return job


def test_a_stop_without_time_for_a_checkpoint_names_the_last_one(tmp_path):
    line, event = deadline_reason(stopped_run(tmp_path, {"step": 13, "checkpoint": None}, (8, 12)), since=99.0)
    assert line == (
        "run dl stopped at its --max-runtime deadline (25 s) at step 13; its last checkpoint is at step 12 (no time "
        "to save another); the same command resumes it with a fresh 25 s window from there"
    )
    assert event == {"max_runtime": 25, "step": 13, "checkpoint": 12}


def test_a_stop_before_the_first_checkpoint_says_the_run_starts_again(tmp_path):
    line, event = deadline_reason(stopped_run(tmp_path, {"step": 3, "checkpoint": None}), since=99.0)
    assert line.endswith(
        "at step 3; no checkpoint yet: the same command starts it again, so give a longer --max-runtime"
    )
    assert event == {"max_runtime": 25, "step": 3, "checkpoint": None}


def test_a_stop_of_an_earlier_launch_does_not_count(tmp_path):
    """The earlier launch's stop at step 9 is history: workers stopped before their first step wrote none."""
    line, event = deadline_reason(stopped_run(tmp_path, None), since=99.0)
    assert line.startswith("run dl stopped at its --max-runtime deadline (25 s); no checkpoint yet")
    assert event["step"] is None
