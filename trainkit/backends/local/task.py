"""A task here: a one-process workload (`Workload.distributed` false: the data copy) run in the launcher's own
process, as `python -m module args` would run it, so nothing of it can outlive the launcher (a kill of the command
ends the copy; the same command resumes it). Its output is this console's; the `error: ...` line it ends with when
it fails is held back and becomes the failure's one line."""

from __future__ import annotations

import io
import os
import runpy
import sys

from training.spec import Job
from trainkit.errors import JobFailed
from trainkit.run.workload import Workload, prepared_env


class HeldErrors(io.TextIOBase):
    """stderr, except the lines that start with `error: `: those are kept (`last`) for the failure's one line."""

    def __init__(self, stream):
        self.stream, self.pending, self.last = stream, "", None

    PREFIX = "error: "

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if line.startswith(self.PREFIX):
                self.last = line.removeprefix(self.PREFIX)
            else:
                self.stream.write(line + "\n")
        start = self.pending[: len(self.PREFIX)]
        if self.pending and not self.PREFIX.startswith(start):  # a progress bar's \r updates pass at once
            self.stream.write(self.pending)
            self.pending = ""
        return len(text)

    def flush(self) -> None:
        if self.pending and not self.pending.startswith(self.PREFIX):
            self.stream.write(self.pending)
            self.pending = ""
        self.stream.flush()


def run_task(job: Job, workload: Workload) -> int:
    """Run the task to its end (see the module's docstring); a failure raises JobFailed with its exit code."""
    extra = {**workload.env, **prepared_env(job, workload)}
    saved_env, saved_argv, saved_err = dict(os.environ), sys.argv, sys.stderr
    held = HeldErrors(sys.stderr)
    os.environ.update(extra)
    sys.argv, sys.stderr = [str(workload.module), *workload.args], held
    try:
        runpy.run_module(str(workload.module), run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    finally:
        held.flush()
        sys.argv, sys.stderr = saved_argv, saved_err
        os.environ.clear()
        os.environ.update(saved_env)
    if code:
        raise JobFailed(code, held.last or f"{job.run.workload} {workload.label} exited with code {code}")
    return 0
