"""Jobs as tests read them: every field by its flag's name, whatever section declares it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from training.common.job import FIELDS, Job
from trainkit.backends import job_from_flags


def flat(job: Job) -> SimpleNamespace:
    values = {spec.key: spec.get(job) for spec in FIELDS}
    return SimpleNamespace(
        **values, world_size=job.world_size, grad_accum_steps=job.grad_accum_steps, run_dir=job.run_dir, job=job
    )


def build_spec(flags: dict, profile: str = "local") -> SimpleNamespace:
    """The complete job for these flags (trainkit.backends.job_from_flags), read flat."""
    return flat(job_from_flags(flags, profile))


def spec_file(run_dir: Path) -> SimpleNamespace:
    """A run's spec.json, read flat."""
    return flat(Job.from_dict(json.loads((Path(run_dir) / "spec.json").read_text())))
