"""A training recipe as a workload: the workers' entry point, started from the run's spec.json, which
`trainkit/run/prepare.py: prepare_run` writes with the data the workers read besides it."""

from __future__ import annotations

from training.spec import Job, worker_arguments
from trainkit.run.workload import Workload


def recipe(job: Job) -> Workload:
    """What `invoke train` runs: the recipe of the job's model, restarted as the job allows. The workers' one entry
    point (`training/__main__.py`) picks the model family's trainer from the spec."""
    return Workload(
        label=job.model.name,
        module="training",
        args=tuple(worker_arguments(job.run_dir)),
        prepare="trainkit.run.prepare:prepare_run",
    )
