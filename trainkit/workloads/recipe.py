"""A training recipe as a workload: the model family's entry point, started from the run's spec.json, which
`trainkit/run/prepare.py: prepare_run` writes with the data the workers read besides it."""

from __future__ import annotations

from training.common.job import Job, worker_arguments
from trainkit.backends.base import Workload
from trainkit.job.models import get_model

ENTRY_POINTS = {"llama": "training.llm.train", "vision": "training.vision.train"}


def recipe(job: Job) -> Workload:
    """What `invoke train` runs: the recipe of the job's model, restarted as the job allows."""
    family = get_model(job.model.name).family
    return Workload(
        kind="recipe",
        label=job.model.name,
        module=ENTRY_POINTS[family],
        args=tuple(worker_arguments(job.run_dir)),
        prepare="trainkit.run.prepare:prepare_run",
    )
