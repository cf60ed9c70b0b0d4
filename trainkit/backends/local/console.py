"""What a local run shows on the launcher's console: rank 0's output, once and unprefixed, then a summary.

The agents send every rank's output to files only (`torchrun --redirects`; the run's logs/ folder keeps
all of it, `invoke logs --rank R` reads any rank). `RankZeroConsole` copies global rank 0's stdout and
stderr files onto this console as they grow, byte for byte (so a progress bar's carriage returns work
in a terminal), and moves to rank 0's new files when an elastic restart gives rank 0 to another
process: the agent that starts a rank records its files in logs/ranks/<rank>.json (trainkit/run/agent.py),
whatever the workload. Rank 0 draws a tqdm bar when this console is a terminal and plain progress lines
otherwise (`TRAINKIT_PROGRESS`), so a log or a pipe gets no carriage-return noise and no line twice.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import BinaryIO

from training.families import family_of
from training.spec import EXPORT_DIR, RANK_LOGS_DIR, Job


def rank_files(record: Path, since: float) -> dict[str, str] | None:
    """A rank's recorded {"stdout": path, "stderr": path}, if written by this invocation (at or after
    `since`: a re-run's folder still holds the last one's); None when absent, older or half-written."""
    try:
        if record.stat().st_mtime < since:
            return None
        files = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    return files if isinstance(files, dict) else None


class RankZeroConsole(threading.Thread):
    """Follows global rank 0's output files onto this process's stdout and stderr until `stop()`."""

    def __init__(self, run_dir: Path, interval: float = 0.1, since: float | None = None):
        super().__init__(name="rank0-console", daemon=True)
        self.record = run_dir / "logs" / RANK_LOGS_DIR / "0.json"
        # A resumed run's folder still holds the last invocation's record: only a rank 0 of this one counts.
        self.since = time.time() - 1 if since is None else since
        self.interval = interval
        self.stopping = threading.Event()
        self.files: dict[str, str] = {}
        self.handles: dict[str, BinaryIO] = {}

    def run(self) -> None:
        try:
            while not self.stopping.wait(self.interval):
                self.pump()
            self.pump()  # what rank 0 wrote last
        except (OSError, ValueError, TypeError, AttributeError):
            pass  # the console went away (a closed pipe): the rank logs keep everything
        finally:
            self.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join()

    def pump(self) -> None:
        # Not written yet, or being replaced: keep following the current files.
        files = rank_files(self.record, self.since) or self.files
        if files != self.files:
            self.copy()  # the end of the old files first
            self.close()
            self.files = files
        self.copy()

    def copy(self) -> None:
        for name in ("stdout", "stderr"):
            if name not in self.handles and self.files.get(name):
                try:
                    self.handles[name] = open(self.files[name], "rb")  # noqa: SIM115 (kept open while followed)
                except OSError:
                    continue
            handle = self.handles.get(name)
            chunk = handle.read() if handle else b""
            if chunk:
                stream = sys.stdout if name == "stdout" else sys.stderr
                stream.flush()
                stream.buffer.write(chunk)
                stream.buffer.flush()

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()
        self.handles = {}


TRACEBACK = "Traceback (most recent call last)"


def other_ranks_errors(run_dir: Path, since: float, lines: int = 15) -> str | None:
    """After a failed run: the last traceback of every other rank whose stderr holds one (rank 0's own
    output is already on the console), each distinct one once, with where the rest is. Only records of
    this invocation (written after `since`) count: a re-run's folder holds the last one's."""
    shown: set[str] = set()
    out: list[str] = []
    records = sorted((run_dir / "logs" / RANK_LOGS_DIR).glob("*.json"), key=lambda path: int(path.stem))
    for record in records:
        if record.stem == "0":
            continue
        files = rank_files(record, since)
        try:
            stderr = Path(files["stderr"]).read_text(errors="replace") if files and files.get("stderr") else ""
        except OSError:
            continue
        if TRACEBACK not in stderr:
            continue
        tail = stderr[stderr.rindex(TRACEBACK) :].splitlines()[-lines:]
        if "\n".join(tail) in shown:
            continue
        shown.add("\n".join(tail))
        out += [
            f"rank {record.stem} failed with (all of it: invoke logs --rank {record.stem}):",
            *(f"  {t}" for t in tail),
        ]
    return "\n".join(out) or None


def evaluation_line(evaluated: dict) -> str:
    """`eval_loss 3.2100 -> 2.0400, best 1.9800 at step 400 (5 evaluations)`: summary.json's `evaluation`."""
    first, last, best = (f"{evaluated[key]:.4f}" for key in ("first", "last", "best"))
    count = evaluated["evaluations"]
    return (
        f"{evaluated['metric']} {first} -> {last}, best {best} at step {evaluated['best_step']} "
        f"({count} evaluation{'s' * (count != 1)})"
    )


def early_line(early: dict) -> str:
    """`early at step 84 of 200: no improvement in the patience's evaluations; best at step 72`."""
    return (
        f"early at step {early['step']} of {early['of']}: the evaluations stopped improving (--early-stop-patience); "
        f"best at step {early['best_step']}"
    )


def exported_from(summary: dict) -> str:
    """` (from the best checkpoint, step 72)`: which checkpoint the export is, where it is not the last one."""
    source = summary.get("exported_from")
    if not source or source["step"] == summary.get("steps"):
        return ""
    return f" (from the {source['checkpoint']} checkpoint, step {source['step']})"


def summary_block(job: Job, wall_s: float) -> str | None:
    """The lines a finished run ends on: loss first -> last, median throughput, wall time, where its
    outputs are, and what to run next. None when the run left no summary (it did not finish)."""
    run_dir = job.run_dir
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    rates = {"samples_per_s": "samples"}  # a script's; a recipe's family counts its own (training/families.py)
    if job.run.workload == "recipe" and job.model.family:
        counted = family_of(job.model.family).throughput
        rates = {counted.record: counted.unit} | ({} if counted.record in rates else rates)
    throughput = [
        f"{summary[key + '_median']:,.0f} {unit}/s" for key, unit in rates.items() if summary.get(key + "_median")
    ]
    first, last = summary.get("first_loss"), summary.get("last_loss")
    loss = f"{first:.4f} -> {last:.4f}" if first is not None and last is not None else "not recorded"
    model = run_dir / EXPORT_DIR
    run = f"{job.run.run_id}" + (f" --runs-dir {job.run.runs_dir}" if job.run.runs_dir != "runs" else "")
    rows = [
        ("loss", f"{loss} over {summary.get('steps', 0)} steps"),
        *([("eval", evaluation_line(summary["evaluation"]))] if summary.get("evaluation") else []),
        *([("stopped", early_line(summary["stopped_early"]))] if summary.get("stopped_early") else []),
        ("throughput", " | ".join(throughput) + " (median over the measured steps)" if throughput else "-"),
        ("wall time", f"{wall_s:.1f} s (this command), restarts {summary.get('restarts', 0)}"),
        ("model", str(model if model.is_dir() else run_dir / "checkpoints") + exported_from(summary)),
        ("metrics", f"{run_dir / 'metrics.jsonl'}, {run_dir / 'summary.json'}"),
        ("logs", f"{run_dir / 'logs'} (invoke logs --run-id {run} --rank R)"),
        ("report", f"invoke obs.report --run {run}  (writes {run_dir / 'report.png'})"),
        ("again", "the same command resumes this run from its last checkpoint, or reports it finished"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join([f"run {job.run.run_id} finished", *(f"  {name:<{width}}  {text}" for name, text in rows)])
