"""The stall watchdog's rules (trainkit/run/watchdog.py) and the ranks' heartbeats (training/common/heartbeat.py), on
a fake clock."""

from __future__ import annotations

import json

import pytest

from training.common import heartbeat as hb
from trainkit.run import stalls
from trainkit.run import watchdog as wd


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def write(folder, rank: int, **beat) -> None:
    """A trainkit beat; `time` is its monotonic time (the wall clock's is elsewhere, far from it)."""
    beat["monotonic"] = beat.pop("time")
    record = {"phase": "step", "timed": 0, "median_s": None, "time": 1.8e9 + beat["monotonic"], **beat}
    (folder / f"rank-{rank}").write_text(json.dumps(record))


def late_after(dog, clock, seconds: float):
    """Nothing is late one second before `seconds` pass since the last beat; what `look` finds one second after."""
    clock.now += seconds - 1
    assert dog.look() is None
    clock.now += 2
    return dog.look()


def test_a_step_gets_ten_medians_at_least_a_minute_and_the_first_steps_ten_minutes(tmp_path):
    clock = Clock()
    dog = wd.Watchdog(tmp_path, clock=clock)
    write(tmp_path, 0, step=2, time=clock.now, timed=2, median_s=0.5)
    assert dog.look() is None
    clock.now += wd.FIRST_STEPS_S - 1  # two steps timed: still the first steps' allowance
    assert dog.look() is None
    clock.now += 2
    stalled = dog.look()
    assert stalled.rank == 0 and stalled.allowance == wd.FIRST_STEPS_S and "first steps" in stalled.why
    write(tmp_path, 0, step=30, time=clock.now, timed=30, median_s=0.5)  # 10 x 0.5 s < the 60 s minimum
    assert late_after(dog, clock, wd.MIN_STALL_S).allowance == wd.MIN_STALL_S
    write(tmp_path, 0, step=40, time=clock.now, timed=40, median_s=12.0)
    clock.now += 119
    assert dog.look() is None
    clock.now += 2
    stalled = dog.look()
    assert stalled.allowance == 120 and stalled.why.startswith("10 x the median step of 12.00 s")


def test_a_step_of_the_wall_clock_ends_no_rank(tmp_path, monkeypatch):
    """The beats' wall-clock times jump an hour ahead and back (NTP, a VM resumed): the watchdog measures with the
    node's monotonic clock, which the beats carry too, so nothing looks late."""
    from training.common import heartbeat as beats

    clock = Clock(5000.0)
    monkeypatch.setattr(beats.time, "monotonic", clock)
    wall = iter([1.8e9, 1.8e9 + 3600, 1.8e9 - 3600])
    monkeypatch.setattr(beats.time, "time", lambda: next(wall))
    heartbeat = beats.Heartbeat(str(tmp_path), rank=0)
    dog = wd.Watchdog(tmp_path, clock=clock)
    for step in (1, 2, 3):
        heartbeat.beat(step)
        clock.now += 1
        assert dog.look() is None
    assert late_after(dog, clock, wd.FIRST_STEPS_S).rank == 0


def test_a_slow_phase_gets_what_it_writes_at_the_storages_throughput_and_never_less_than_stall_timeout(tmp_path):
    """A 70B checkpoint of 847 GB (the review's figure) on the 4,800 GiB FSx at 250 MB/s per TiB (1,172 MB/s): about
    12 min to write, 18 with the margin; the fixed 600 s of before ended every such save. --stall-timeout 3600 was
    ended at 601 s."""
    planned = wd.budgets(None, {"checkpoint": 847_000_000_000, "export": 1_129_000_000_000}, 250 * 4800 / 1024)
    assert 1080 <= planned["checkpoint"].seconds <= 1090 and planned["checkpoint"].why == "847.0 GB at 1,172 MB/s x 1.5"
    assert wd.describe_budget("checkpoint", planned["checkpoint"]) == (
        "checkpoint allowance 18 min: 847.0 GB at 1,172 MB/s x 1.5"
    )
    assert planned["export"].seconds > planned["checkpoint"].seconds
    assert planned["evaluate"] == wd.Budget(wd.SLOW_PHASE_S, "at least 600 s")  # it writes nothing
    clock = Clock()
    dog = wd.Watchdog(tmp_path, clock=clock, planned=planned)
    write(tmp_path, 0, step=100, time=clock.now, phase="checkpoint", timed=100, median_s=2.0)
    clock.now += 1000  # a healthy save, past the old 600 s
    assert dog.look() is None
    clock.now += 100
    stalled = dog.look()
    assert (
        stalled.allowance == planned["checkpoint"].seconds
        and stalled.why == "a checkpoint: 847.0 GB at 1,172 MB/s x 1.5"
    )

    long_timeout = wd.Watchdog(tmp_path, stall_timeout=3600, clock=clock)
    write(tmp_path, 0, step=100, time=clock.now, phase="checkpoint", timed=100, median_s=2.0)
    assert late_after(long_timeout, clock, 3600).why == "a checkpoint: --stall-timeout"


def test_stall_timeout_sets_a_steps_allowance_and_a_short_one_leaves_a_checkpoint_ten_minutes(tmp_path):
    clock = Clock()
    dog = wd.Watchdog(tmp_path, stall_timeout=5, clock=clock)
    write(tmp_path, 1, step=10, time=clock.now, timed=10, median_s=0.3)
    clock.now += 4.5
    assert dog.look() is None
    clock.now += 1
    assert dog.look().why == "--stall-timeout"
    write(tmp_path, 1, step=10, time=clock.now, phase="checkpoint", timed=10, median_s=0.3)
    assert late_after(dog, clock, wd.SLOW_PHASE_S).why == "a checkpoint: at least 600 s"


def test_a_slow_phase_gets_ten_times_the_longest_one_seen_and_a_restart_keeps_the_runs(tmp_path):
    watch = wd.RankWatch(wd.Beat(10, "checkpoint", 0.0, timed=10, median_s=1.0, stamp=1))
    watch.see(wd.Beat(10, "step", 200.0, timed=10, median_s=1.0, stamp=2))  # a 200 s checkpoint
    watch.see(wd.Beat(20, "checkpoint", 210.0, timed=20, median_s=1.0, stamp=3))
    assert watch.allowance(None) == (2000.0, "a checkpoint: 10 x the run's longest, 200 s")
    # a new round of workers: the run's own checkpoint events say how long its saves took
    run_dir, beats = tmp_path / "run", tmp_path / "beats"
    run_dir.mkdir()
    beats.mkdir()
    (run_dir / "events.jsonl").write_text(
        "".join(
            json.dumps({"event": "checkpoint", "time": 1.8e9 + i, "step": i, "seconds": s}) + "\n"
            for i, s in [(10, 95.5), (20, 140.0), (30, 120.0)]
        )
    )
    clock = Clock()
    dog = wd.Watchdog(beats, clock=clock, run_dir=run_dir)
    dog.reset()
    write(beats, 0, step=40, time=clock.now, phase="checkpoint", timed=0)
    assert late_after(dog, clock, 1400).why == "a checkpoint: 10 x the run's longest, 140 s"


def test_a_scaled_clock_counts_every_second_for_many(tmp_path):
    """The e2e tests' time scale (training/common/faults.py TIME_SCALE_ENV): at 100, 6 s of a checkpoint are 600."""
    clock = Clock()
    dog = wd.Watchdog(tmp_path, clock=clock, scale=100)
    write(tmp_path, 0, step=10, time=clock.now, phase="checkpoint", timed=10, median_s=0.01)
    clock.now += 5.9
    assert dog.look() is None
    clock.now += 0.2
    stalled = dog.look(force=True)
    assert stalled.allowance == wd.SLOW_PHASE_S and 600 < stalled.seconds < 620


def test_the_agent_times_steps_itself_where_the_beat_is_a_bare_number(tmp_path):
    """A user's script that writes its step into the file: the agent's own looks time it and give the medians."""
    clock = Clock(100.0)
    dog = wd.Watchdog(tmp_path, clock=clock)
    path = tmp_path / "rank-3"
    for step in range(0, 12, 2):
        path.write_text(str(step))
        assert not wd.read_beat(path).dumps
        assert dog.look(force=True) is None
        clock.now += 2
    watch = dog.ranks[3]
    assert watch.timed_steps == 10 and watch.last.time == 110.0 and watch.allowance(None)[0] == 60.0
    clock.now += 56.5  # 58.5 s since it saw step 10 written
    assert dog.look(force=True) is None
    clock.now += 2
    assert dog.look(force=True).rank == 3


def test_unreadable_beats_are_skipped_and_reset_forgets_a_round(tmp_path):
    (tmp_path / "rank-0").write_text("{half")
    (tmp_path / "rank-x").write_text("3")
    clock = Clock()
    dog = wd.Watchdog(tmp_path, clock=clock)
    assert dog.look() is None and dog.ranks == {}
    write(tmp_path, 0, step=1, time=clock.now - 10_000)
    assert dog.look(force=True).rank == 0
    dog.reset()
    assert dog.ranks == {} and not list(tmp_path.iterdir())


def test_the_heartbeat_times_only_steps_and_restores_the_phase_it_left(tmp_path, monkeypatch):
    times = iter([0.0, 1.0, 2.0, 3.0, 50.0, 51.0, 52.0, 60.0, 61.0])
    monkeypatch.setattr(hb.time, "monotonic", lambda: next(times))
    beat = hb.Heartbeat(str(tmp_path), rank=2)
    read = lambda: json.loads((tmp_path / "rank-2").read_text())  # noqa: E731
    beat.beat(0)
    beat.beat(1)
    beat.beat(3)  # two steps in one second
    assert read()["timed"] == 3 and read()["median_s"] == pytest.approx(0.75)  # of 1.0 and 0.5 s
    with beat.phase("checkpoint"):  # 3 -> 50: the save
        assert read()["phase"] == "checkpoint"
    assert read()["phase"] == "step" and read()["monotonic"] == 50.0
    beat.beat(4)  # one second after the save, not 48
    assert read()["timed"] == 4 and read()["median_s"] == pytest.approx(1.0)  # of 1.0, 0.5 and 1.0 s
    beat.beat(4, "export")
    with beat.phase("checkpoint"):
        pass
    assert read()["phase"] == "export"  # back to what it did before, not to stepping
    with pytest.raises(ValueError, match="phase 'step': one of checkpoint, evaluate, export"):
        beat.enter("step")


def test_outside_a_job_a_beat_does_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(hb.HEARTBEAT_DIR_ENV, raising=False)
    beat = hb.Heartbeat()
    beat.beat(5)
    assert beat.path is None and beat.step == 5


def test_innermost_frame_of_the_main_thread_in_a_faulthandler_dump():
    dump = (
        "Thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n\n'
        "Current thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
        '  File "/w/training/common/trainer.py", line 106 in token_mean_step\n'
    )
    frame = stalls.innermost_frame(dump, 0x7F0000000001)
    assert frame == ("/v/site-packages/torch/distributed/distributed_c10d.py", 3252, "all_reduce")
    assert stalls.where("S", frame, True) == (
        "waiting in a collective (torch/distributed/distributed_c10d.py:3252 in all_reduce)",
        True,
    )
    other = stalls.innermost_frame(dump, 0x7F0000000002)
    assert stalls.where("S", other, True) == (
        "not in a collective: /usr/lib/python3.11/threading.py:331 in wait",
        False,
    )
    assert stalls.where("T", None, True) == ("stopped by a signal", False)
    assert stalls.where(None, None, True)[1] is None  # gone: tells nothing either way


def test_the_cause_names_who_did_not_arrive_or_says_the_peer_is_elsewhere():
    report = {
        "rank": 0,
        "seconds": 65.2,
        "step": 11,
        "allowance_s": 60.0,
        "allowance": "10 x the median step of 0.30 s, at least 60 s",
        "ranks": {"0": {"doing": "waiting in a collective (x.py:1 in f)"}, "1": {"doing": "stopped by a signal"}},
        "not_arrived": [1],
        "in_collective": [0],
    }
    line = stalls.cause(report)
    assert line.startswith("stalled: rank 0 finished no step for 65 s after step 11 (allowed 60 s: 10 x the median")
    assert "did not arrive: rank 1 stopped by a signal" in line
    assert "on another node" in stalls.cause({**report, "not_arrived": [], "in_collective": [0, 1]})
    again = stalls.cause({**report, "repeated": True})
    assert again.endswith("; the run stalled after step 11 before: a hang of the job's own, which a restart repeats")


def test_a_stall_at_a_step_where_the_run_stalled_before_counts_each_round_once(tmp_path):
    """Rounds are what lies between the run's start and resume events: two nodes' findings of one stall are one
    round's, whatever attempt number each node's agent counted (an agent restarted for a peer's new round counts none);
    a stall at another step is not this one; the round now running is not an earlier one."""
    events = tmp_path / "events.jsonl"

    def add(*records: dict) -> None:
        with events.open("a") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in records)

    add({"event": "start", "time": 90.0, "step": 0})
    add(
        json.loads(stalled_event("n0", 100.0, [1])) | {"attempt": 1},
        json.loads(stalled_event("n1", 100.5, [])) | {"attempt": 0},
    )
    assert stalls.repeated_stall(tmp_path, 5) == 0  # this round's own findings
    add({"event": "resume", "time": 110.0, "step": 4})
    assert stalls.repeated_stall(tmp_path, 5) == 1  # the node that counted attempt 0 too: one earlier round
    assert stalls.repeated_stall(tmp_path, 6) == 0
    add(json.loads(stalled_event("n1", 120.0, [1])), {"event": "resume", "time": 130.0, "step": 4})
    assert stalls.repeated_stall(tmp_path, 5) == 2


def stalled_event(node: str, when: float, not_arrived: list[int]) -> str:
    """A node's `stalled` event: its rank 1 stopped (not_arrived [1]), or its rank 0 waiting for a peer elsewhere."""
    rank = 1 if not_arrived else 0
    doing = "stopped by a signal" if not_arrived else "waiting in a collective (x.py:1 in all_reduce)"
    report = {"rank": rank, "step": 5, "seconds": 7.0, "allowance_s": 6.0, "allowance": "--stall-timeout"}
    report |= {"ranks": {str(rank): {"doing": doing}}, "not_arrived": not_arrived}
    report["in_collective"] = [] if not_arrived else [0]
    return json.dumps({"event": "stalled", "time": when, "node": node, **report}) + "\n"


def test_a_node_whose_ranks_waited_for_a_hung_rank_elsewhere_names_that_rank(tmp_path):
    """Both nodes' watchdogs fire on one stall: a node whose ranks waited for a peer elsewhere, or whose collective
    broke when the other node ended its ranks, takes the finding of the node whose rank hung (waiting a moment for
    it); that node keeps its own; a permanent failure, or a stall long before, is not this one."""
    import threading

    events = tmp_path / "events.jsonl"
    events.write_text(stalled_event("node-0", 100.0, []))
    waited = {"source": "agent", "rank": 0, "node_name": "node-0", "time": 100.1, "stalled": True, "cause": "stalled"}
    assert stalls.stall_elsewhere(tmp_path, waited, wait_s=0.1) is None  # the hung rank's node never said

    def hung_node_says() -> None:
        with events.open("a") as handle:
            handle.write(stalled_event("node-1", 101.0, [1]))

    threading.Timer(0.3, hung_node_says).start()
    found = stalls.stall_elsewhere(tmp_path, waited, wait_s=5)
    assert found["node_name"] == "node-1" and found["rank"] == 1 and not found["permanent"], found
    assert found["cause"].startswith("stalled: rank 1 ") and "did not arrive: rank 1 stopped by a" in found["cause"]
    broken = {"source": "worker", "rank": 0, "node_name": "node-0", "time": 101.2, "cause": "RuntimeError: closed"}
    assert stalls.stall_elsewhere(tmp_path, broken, wait_s=0)["node_name"] == "node-1"
    assert stalls.stall_elsewhere(tmp_path, {**waited, "node_name": "node-1"}, wait_s=0) is None
    assert stalls.stall_elsewhere(tmp_path, {**broken, "permanent": True}, wait_s=0) is None
    assert stalls.stall_elsewhere(tmp_path, {**broken, "time": 200.0}, wait_s=0) is None


def test_stall_restarts_count_the_resumes_that_followed_a_stall(tmp_path):
    from types import SimpleNamespace

    from training.common.run import RunContext

    events = tmp_path / "events.jsonl"
    kinds = ["start", "checkpoint", "stalled", "stalled", "resume", "resume", "stalled"]  # two nodes saw one stall
    events.write_text("".join(json.dumps({"event": kind, "time": 1.0}) + "\n" for kind in kinds))
    # the resume being made now follows the last stall: 2 in all (the second resume followed a lost node)
    assert RunContext._stall_restarts(SimpleNamespace(run_dir=tmp_path)) == 2
    assert RunContext._stall_restarts(SimpleNamespace(run_dir=tmp_path / "none")) == 0
