"""The local console's parts in process: following rank 0 across an elastic restart, progress lines."""

from __future__ import annotations

import json

from training.common.run import ProgressLines
from trainkit.backends.local_console import RankZeroConsole


def test_rank_zero_console_follows_new_files_after_a_restart(tmp_path, capfdbinary):
    ranks = tmp_path / "logs" / "ranks"
    ranks.mkdir(parents=True)
    first, second = tmp_path / "a0.log", tmp_path / "b0.log"
    console = RankZeroConsole(tmp_path)
    console.pump()  # nothing recorded yet: nothing shown, no error
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


def test_progress_lines_one_per_tenth_and_the_last(capsys):
    bar = ProgressLines("run-x", start=0, total=25, quiet=False)
    for step in range(25):
        bar.set_postfix(loss=f"{step:.1f}")
        bar.update(1)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in lines] == [
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
    assert [line.split()[2] for line in lines] == ["60/100", "70/100", "80/100", "90/100", "100/100"]
