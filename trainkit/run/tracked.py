"""The end of a tracked run (issue 54), recorded by whoever knows how it ended: the launcher for a run on this
machine, the job's node on a cluster. Its MLflow run gets the end state with the one-line cause, the summary and the
report PNG (trainkit/plan/report.py, as `invoke obs.report` draws it) as artifacts, and the export's location."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from training.common.tracking import end_run
from training.spec import SUMMARY_FILE, Job

FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"


def end_tracked(job: Job, status: str, cause: str | None = None) -> None:
    """Record the run's end in its MLflow run. The report is drawn into a folder of this process's own (on a shared
    volume every node of a finished job records the same end: none writes a file another reads)."""
    if not job.tracking.enabled:
        return
    with tempfile.TemporaryDirectory(prefix="trainkit-report-") as folder:
        artifacts = [job.run_dir / SUMMARY_FILE]
        if (job.run_dir / "metrics.jsonl").is_file():
            # A report that cannot be drawn (no step logged, an odd record) leaves the other records to be made.
            with contextlib.suppress(Exception):
                from trainkit.plan.report import write_report

                artifacts.append(write_report(job.run_dir, Path(folder) / "report.png"))
        end_run(job, job.run_dir, status, cause, artifacts)
