"""Job backends: where a run executes (README.md in this folder says what a backend must provide).

`resolve_job` is the whole path from what the user typed to a job ready to submit, in one direction:
build (profile, then flags; pure) -> the backend resolves what depends on where the job runs ->
derive (recipe and derived values; pure) -> validate (pure, changes nothing), the target-free rules, then
the backend's own.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from training.common.job import SPEC_FILE, Job
from trainkit.backends.base import Backend, RunRef
from trainkit.errors import SpecError
from trainkit.job import Machine, build, derive, validate

# target -> "module:class"; a new backend is one module and one line here.
BACKENDS = {
    "local": "trainkit.backends.local.backend:LocalBackend",
    "eks": "trainkit.backends.eks.backend:EksBackend",
    "sagemaker": "trainkit.backends.sagemaker.backend:SageMakerBackend",
}


def get_backend(target: str) -> Backend:
    if target not in BACKENDS:
        raise SpecError(f"--target {target!r} is not valid; choose one of: {', '.join(BACKENDS)}")
    module, _, name = BACKENDS[target].partition(":")
    return getattr(importlib.import_module(module), name)()


def resolve_job(flags: dict[str, Any], profile: str = "local") -> tuple[Job, Backend, Machine]:
    """The job, the backend that runs it, and what a node of its target offers (GPUs per node)."""
    job = build(flags, profile)
    backend = get_backend(job.placement.target)
    machine = backend.resolve(job)
    derive(job, machine)
    validate(job, machine)
    backend.check(job)
    return job, backend, machine


def job_from_flags(flags: dict[str, Any], profile: str = "local") -> Job:
    """The complete, validated job for these flags (what `invoke train` would submit)."""
    return resolve_job(flags, profile)[0]


__all__ = ["BACKENDS", "Backend", "RunRef", "backend_of", "get_backend", "job_from_flags", "resolve_job"]


def backend_of(run_id: str | None, target: str | None, runs_dir: str) -> Backend:
    """The backend that holds a run: `target`, else local when the run (or, without a run id, any run)
    is in the local runs folder, else SageMaker when this machine submitted it there, else EKS."""
    if target is None:
        from trainkit.backends.sagemaker.api import remembered

        runs = Path(runs_dir)
        local = (runs / run_id / SPEC_FILE).is_file() if run_id else any(runs.glob(f"*/{SPEC_FILE}"))
        target = "local" if local else "sagemaker" if remembered(run_id) else "eks"
    return get_backend(target)
