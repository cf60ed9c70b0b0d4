"""A run's progress on the console: a tqdm bar where the launcher's console is a terminal, else plain lines that
a log, a pipe and SageMaker's metric definitions read (trainkit/backends/sagemaker/request.py METRICS)."""

from __future__ import annotations

import os
import time

from training.spec import PROGRESS_ENV


def progress_display(run_id: str, start: int, total_steps: int, quiet: bool):
    """A tqdm bar where the launcher's console is a terminal (`TRAINKIT_PROGRESS=bar`), else ProgressLines; nothing
    shown when `quiet` (every rank but the main one)."""
    if os.environ.get(PROGRESS_ENV) == "bar":
        from tqdm import tqdm

        return tqdm(total=total_steps, initial=start, disable=quiet, desc=run_id, unit="step")
    return ProgressLines(run_id, start, total_steps, quiet)


def eval_line(run_id: str, step: int, figures: dict[str, float]) -> str:
    """The line an evaluation prints (`<run> eval at step 40: eval_loss=2.0412 eval_ppl=7.7002`), which SageMaker's
    metric definitions read (trainkit/backends/sagemaker/request.py eval_metrics)."""
    return f"{run_id} eval at step {step}: " + " ".join(f"{name}={value:.4f}" for name, value in figures.items())


class ProgressLines:
    """The part of tqdm's interface the trainers use, as plain lines: `<run> step 12/60 (20%) loss=...`
    at the first step, each tenth of the run, the last step, and at least every EVERY_S seconds between,
    so a log or a pipe gets no carriage returns and a slow run still shows it is alive."""

    EVERY_S = 30.0

    def __init__(self, run_id: str, start: int, total: int, quiet: bool):
        self.run_id, self.step, self.total, self.quiet = run_id, start, total, quiet
        self.postfix: dict[str, str] = {}
        self.started = time.perf_counter()
        self.next_tenth = self._tenth(start) + 1
        self.last: float | None = None

    def _tenth(self, step: int) -> int:
        return step * 10 // max(1, self.total)

    def set_postfix(self, **values: str) -> None:
        self.postfix = values

    def update(self, steps: int = 1) -> None:
        self.step += steps
        now = time.perf_counter()
        due = (
            self._tenth(self.step) >= self.next_tenth
            or self.step >= self.total
            or self.last is None  # the first step: the run is alive
            or now - self.last >= self.EVERY_S
        )
        if self.quiet or not due:
            return
        self.last = now
        self.next_tenth = self._tenth(self.step) + 1
        values = " ".join(f"{k}={v}" for k, v in self.postfix.items())
        elapsed = now - self.started
        percent = 100 * self.step // max(1, self.total)
        print(f"{self.run_id} step {self.step}/{self.total} ({percent}%) {values} [{elapsed:.0f} s]", flush=True)

    def write(self, line: str) -> None:
        """A line of its own between the progress lines (tqdm's `write`), from the main rank only."""
        if not self.quiet:
            print(line, flush=True)

    def close(self) -> None:
        pass
