"""A local run's --max-runtime deadline: what the launcher says and keeps once it has stopped the run there.

The launcher (backend.py, LocalJob.wait) stops the agents when --max-runtime seconds have passed since it started
them, as a user's stop does: SIGTERM, the workers finish the step in flight and save a checkpoint when the grace
allows. The run then ends as failed with exit code 124 (timeout(1)'s, so a script tells it from a failure or a
Ctrl-C), a one-line reason on the console, in failure.json (`invoke status`) and a `deadline` event in
events.jsonl. The same command resumes it with a fresh window: each launch gets its own, as each attempt does
under Batch's timeout.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from training.common.checkpoint import CHECKPOINTS_DIR, complete_steps, step_of_dir
from training.common.files import append_event, read_events
from training.spec import Job
from trainkit.run.failures import record_failure

EXIT_DEADLINE = 124
DEADLINE_EVENT = "deadline"


def stop_event(run_dir: Path, since: float) -> dict:
    """The main rank's last `stop` event written after `since` (wall clock), or {} (a user's script writes none; a
    line cut short by a kill is skipped)."""
    stops = [e for e in read_events(run_dir) if e.get("event") == "stop" and e.get("time", 0) >= since]
    return stops[-1] if stops else {}


def deadline_reason(job: Job, since: float) -> tuple[str, dict]:
    """The one line of a run stopped at its --max-runtime deadline at `since` (wall clock), and its `deadline`
    event's fields: the step and checkpoint of the main rank's stop (a checkpoint when the grace allowed one), else
    the newest published checkpoint."""
    limit = job.placement.max_runtime
    stop = stop_event(job.run_dir, since)
    step, saved = stop.get("step"), stop.get("checkpoint")
    latest = complete_steps(job.run_dir / CHECKPOINTS_DIR)
    last = step_of_dir(latest[-1].name) if latest else None
    line = f"run {job.run.run_id} stopped at its --max-runtime deadline ({limit} s)"
    if step is not None:
        line += f" at step {step}"
    again = f"the same command resumes it with a fresh {limit} s window"
    if saved is not None:
        line += f"; checkpoint at step {saved} saved; {again}"
    elif last is not None:
        line += f"; its last checkpoint is at step {last} (no time to save another); {again} from there"
    elif job.run.workload == "recipe":
        line += "; no checkpoint yet: the same command starts it again, so give a longer --max-runtime"
    else:
        line += f"; the same command runs it again with a fresh {limit} s window"
    event = {"max_runtime": limit, "step": step, "checkpoint": saved if saved is not None else last}
    return line, event


def record_deadline(job: Job, since: float) -> str:
    """Keep the deadline's stop at `since` (wall clock) for `invoke status` and the run's history; returns its line."""
    line, event = deadline_reason(job, since)
    with contextlib.suppress(OSError):  # a full volume: the failure record has a way out of its own
        append_event(job.run_dir, DEADLINE_EVENT, source="launcher", **event)
    cause = {"source": "launcher", "time": time.time(), "cause": line, "deadline": job.placement.max_runtime}
    record_failure(job.run_dir, cause, EXIT_DEADLINE)
    return line
