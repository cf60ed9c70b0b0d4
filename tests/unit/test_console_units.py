"""The local console's parts in process: following rank 0 across an elastic restart, progress lines."""

from __future__ import annotations

import json
import os

from training.common.progress import ProgressLines
from trainkit.backends.local.console import RankZeroConsole, other_ranks_errors


def test_rank_zero_console_follows_new_files_after_a_restart(tmp_path, capfdbinary):
    ranks = tmp_path / "logs" / "ranks"
    ranks.mkdir(parents=True)
    first, second = tmp_path / "a0.log", tmp_path / "b0.log"
    stale = tmp_path / "earlier.log"
    stale.write_bytes(b"an earlier invocation's output\n")
    (ranks / "0.json").write_text(json.dumps({"stdout": str(stale)}))
    os.utime(ranks / "0.json", (1, 1))
    console = RankZeroConsole(tmp_path)
    console.pump()  # only the last invocation's record: nothing shown, no error
    first.write_bytes(b"step 1\r")
    (ranks / "0.json").write_text(json.dumps({"stdout": str(first)}))
    console.pump()
    with first.open("ab") as handle:
        handle.write(b"step 2\n")
    second.write_bytes(b"resumed\n")
    (ranks / "0.json").write_text(json.dumps({"stdout": str(second)}))  # rank 0 is another process now
    console.pump()
    (ranks / "0.json").write_text("{")  # half-written record: keep following the current files
    with second.open("ab") as handle:
        handle.write(b"done\n")
    console.pump()
    console.close()
    assert capfdbinary.readouterr().out == b"step 1\rstep 2\nresumed\ndone\n"


def test_progress_lines_first_step_each_tenth_and_the_last(capsys):
    bar = ProgressLines("run-x", start=0, total=25, quiet=False)
    for step in range(25):
        bar.set_postfix(loss=f"{step:.1f}")
        bar.update(1)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in lines] == [
        "1/25",
        "3/25",
        "5/25",
        "8/25",
        "10/25",
        "13/25",
        "15/25",
        "18/25",
        "20/25",
        "23/25",
        "25/25",
    ]
    assert lines[-1].startswith("run-x step 25/25 (100%) loss=24.0")


def test_progress_lines_after_a_resume_and_on_other_ranks(capsys):
    resumed = ProgressLines("run-x", start=50, total=100, quiet=False)
    for _ in range(50):
        resumed.update(1)
    ProgressLines("run-x", start=0, total=10, quiet=True).update(10)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in lines] == ["51/100", "60/100", "70/100", "80/100", "90/100", "100/100"]


def test_other_ranks_errors_show_each_distinct_traceback_once(tmp_path):
    ranks = tmp_path / "logs" / "ranks"
    ranks.mkdir(parents=True)
    boom = "Traceback (most recent call last):\n  File x\nValueError: boom\n"
    for rank, text in ((0, boom), (1, "warning\n" + boom), (2, boom), (3, "all fine\n")):
        (tmp_path / f"{rank}.err").write_text(text)
        (ranks / f"{rank}.json").write_text(json.dumps({"stderr": str(tmp_path / f"{rank}.err")}))
    os.utime(ranks / "2.json", (1, 1))  # an earlier invocation's rank 2 (same traceback as rank 1)
    (tmp_path / "4.err").write_text("Traceback (most recent call last):\nOSError: stale\n")
    (ranks / "4.json").write_text(json.dumps({"stderr": str(tmp_path / "4.err")}))
    os.utime(ranks / "4.json", (1, 1))  # an earlier invocation's failure: not this run's cause
    report = other_ranks_errors(tmp_path, since=100).splitlines()
    assert report[0].startswith("rank 1 failed") and "invoke logs --rank 1" in report[0]
    assert report[1:] == ["  Traceback (most recent call last):", "    File x", "  ValueError: boom"]
    assert "stale" not in "\n".join(report)
    assert other_ranks_errors(tmp_path / "nothing", since=0) is None


def test_progress_lines_show_a_slow_run_is_alive(capsys, monkeypatch):
    clock = iter([0.0, 1.0, 31.5, 40.0, 62.0])  # started, then one reading per update
    monkeypatch.setattr("training.common.run.time.perf_counter", lambda: next(clock))
    bar = ProgressLines("slow", start=0, total=1000, quiet=False)
    for _ in range(4):
        bar.update(1)
    assert [line.split()[2] for line in capsys.readouterr().out.splitlines()] == ["1/1000", "2/1000", "4/1000"]
