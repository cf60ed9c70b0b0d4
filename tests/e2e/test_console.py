"""What a user sees of a local run: rank 0's output once, unprefixed, progress as plain lines in a log
and as a bar in a terminal; every rank's output kept in its own log; a summary block at the end."""

from __future__ import annotations

import json
import os
import pty
import subprocess
from pathlib import Path

from tests.helpers.paths import BIN, REPO

INVOKE = str(BIN / "invoke")


def test_console_of_a_run_in_a_log(tiny_make_train):
    """What the session's `make train MODEL=llama2-tiny` printed, captured as a log or CI would."""
    run_dir, result = tiny_make_train
    console = result.stdout + result.stderr
    assert "[default" not in console and "\r" not in console, console[-3000:]
    run_id, runs = run_dir.name, run_dir.parent
    summary = json.loads((run_dir / "summary.json").read_text())
    total = summary["steps"]
    tenth = max(1, total // 10)
    steps = [line for line in result.stdout.splitlines() if line.startswith(f"{run_id} step ")]
    # the first step (the run is alive), then each tenth of the run (and a line every 30 s on a slow machine)
    shown = [int(line.split()[2].split("/")[0]) for line in steps]
    assert shown[0] == 1 and shown == sorted(set(shown)) and shown[-1] == total, steps
    assert set(range(tenth, total + 1, tenth)) <= set(shown), steps
    printed = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(set(printed)) == len(printed), "a line twice"

    # The console carries rank 0's whole stdout, in order; every rank's files are recorded and kept.
    ranks = {int(p.stem): json.loads(p.read_text()) for p in (run_dir / "logs" / "ranks").glob("*.json")}
    assert sorted(ranks) == [0, 1] and all(Path(f).is_file() for files in ranks.values() for f in files.values())
    rank0 = Path(ranks[0]["stdout"]).read_text()
    assert "whole examples, packing efficiency" in rank0 and rank0 in result.stdout  # the data's start line

    block = result.stdout[result.stdout.index(f"run {run_id} finished") :].splitlines()
    fields = {line.split()[0]: line.split(None, 1)[1] for line in block[1:] if line.strip()}
    expected = f"{summary['first_loss']:.4f} -> {summary['last_loss']:.4f} over {total} steps"
    assert fields["loss"].startswith(expected)
    assert fields["throughput"].startswith(f"{summary['tokens_per_s_median']:,.0f} tokens/s")
    assert float(fields["wall"].split()[1]) > summary["wall_time_s"] > 0  # "wall time N s (this command)"
    assert Path(fields["model"]) == run_dir / "model" and (run_dir / "model").is_dir()
    assert f"invoke obs.report --run {run_id} --runs-dir {runs}" in fields["report"]
    assert block[-1].strip().startswith("again")


def test_console_of_a_run_in_a_terminal(tmp_path):
    """In a terminal rank 0 draws one tqdm bar (carriage returns), still without a rank prefix."""
    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [
            INVOKE,
            "train",
            "--model",
            "llama2-tiny",
            "--steps",
            "4",
            "--metrics-port",
            "0",
            "--runs-dir",
            str(tmp_path / "runs"),
        ],
        cwd=REPO,
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env={k: v for k, v in os.environ.items() if k != "TRAINKIT_PROGRESS"},
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the terminal closed: every writer has exited
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    assert process.wait(timeout=600) == 0
    screen = b"".join(chunks).decode(errors="replace")
    (run_dir,) = (p for p in (tmp_path / "runs").iterdir() if not p.name.startswith("."))
    assert "[default" not in screen
    assert f"\r{run_dir.name}: 100%" in screen and "4/4" in screen, screen[-3000:]
    assert f"{run_dir.name} step " not in screen  # the bar, not the plain lines
    assert f"run {run_dir.name} finished" in screen
