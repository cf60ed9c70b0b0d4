"""Reading a run's JSON-lines files back (training/common/files.py, read_jsonl) while writers append to them or after
one was killed mid-append: whole lines are kept, in order, and what a kill cut short is not."""

from __future__ import annotations

from training.common.files import EVENTS_FILE, append_event, read_events, read_jsonl


def test_a_line_torn_by_a_kill_is_skipped_and_the_whole_ones_kept(tmp_path):
    append_event(tmp_path, "start", step=0)
    append_event(tmp_path, "checkpoint", step=10)
    with (tmp_path / EVENTS_FILE).open("a") as events:
        events.write('{"event": "stop", "st')  # its writer killed mid-append
    assert [(e["event"], e["step"]) for e in read_jsonl(tmp_path / EVENTS_FILE)] == [("start", 0), ("checkpoint", 10)]


def test_a_line_appended_after_a_torn_one_loses_only_the_torn_one(tmp_path):
    """The next writer's line joins the torn one: that joined line is lost, the lines after it are read."""
    append_event(tmp_path, "start", step=0)
    with (tmp_path / EVENTS_FILE).open("ab") as events:
        events.write('{"event": "stalled", "note": "€'.encode()[:-1])  # cut inside a character, too
    append_event(tmp_path, "resume", step=8)
    append_event(tmp_path, "checkpoint", step=12)
    found = read_jsonl(tmp_path / EVENTS_FILE)
    assert [(e["event"], e["step"]) for e in found] == [("start", 0), ("checkpoint", 12)]


def test_a_missing_file_has_no_records(tmp_path):
    assert read_jsonl(tmp_path / "metrics.jsonl") == []


def test_a_runs_events_are_its_file_and_each_nodes_own_in_time_order(tmp_path, monkeypatch):
    """Where each host has its own copy of the run folder (SageMaker), a host's agent appends to events.<host>.jsonl
    so the hosts' copies do not replace each other's in S3; the run's events are all of them, by time."""
    from trainkit.run.agent import events_file

    ticks = iter(range(100, 200))
    monkeypatch.setattr("training.common.files.time.time", lambda: float(next(ticks)))
    append_event(tmp_path, "start", step=0)
    monkeypatch.setenv("TRAINKIT_CHECKPOINT_HOST", "algo-2")
    append_event(tmp_path, "stalled", file=events_file(), step=5)
    append_event(tmp_path, "resume", step=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.algo-2.jsonl", EVENTS_FILE]
    assert [e["event"] for e in read_events(tmp_path)] == ["start", "stalled", "resume"]
    monkeypatch.delenv("TRAINKIT_CHECKPOINT_HOST")
    assert events_file() == EVENTS_FILE  # one run folder for every node: one file
    assert read_events(tmp_path / "none") == []
