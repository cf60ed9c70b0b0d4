"""Job backends: where a run executes (README.md in this folder says what a backend must provide).

`resolve_job` is the whole path from what the user typed to a job ready to submit, in one direction:
build (profile, then flags; pure) -> the backend resolves what depends on where the job runs ->
derive (recipe and derived values; pure) -> validate (pure, changes nothing), the target-free rules, then
the backend's own -> what the stall watchdog allows a checkpoint (the storage's throughput: the target's).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from training.spec import SPEC_FILE, Job
from trainkit.backends.aws import Submissions
from trainkit.backends.base import Backend, RunRef
from trainkit.errors import SpecError
from trainkit.job import Machine, build, derive, validate
from trainkit.job.tracking import tracking_notes
from trainkit.run.storage import plan_slow_phases

# target -> "module:class"; a new backend is one module and one line here.
BACKENDS = {
    "local": "trainkit.backends.local.backend:LocalBackend",
    "eks": "trainkit.backends.eks.backend:EksBackend",
    "sagemaker": "trainkit.backends.sagemaker.backend:SageMakerBackend",
    "batch": "trainkit.backends.batch.backend:BatchBackend",
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
    job.run.notes.extend(tracking_notes(job))
    plan_slow_phases(job, backend.storage_mb_s, backend.storage_hosts)
    return job, backend, machine


def job_from_flags(flags: dict[str, Any], profile: str = "local") -> Job:
    """The complete, validated job for these flags (what `invoke train` would submit)."""
    return resolve_job(flags, profile)[0]


__all__ = ["BACKENDS", "Backend", "RunRef", "backend_of", "get_backend", "job_from_flags", "resolve_job"]


REMEMBERED = ("sagemaker", "batch")
"""The targets whose submissions this machine keeps in its state folder (`<target>/<run id>.json`)."""


def backend_of(run_id: str | None, target: str | None, runs_dir: str) -> Backend:
    """The backend that holds a run: `target`, else local when the run (or, without a run id, any run)
    is in the local runs folder, else the target this machine submitted it to last (SageMaker, Batch), else EKS."""
    if target is None:
        runs = Path(runs_dir)
        local = (runs / run_id / SPEC_FILE).is_file() if run_id else any(runs.glob(f"*/{SPEC_FILE}"))
        target = "local" if local else last_submitted_to(run_id) or "eks"
    return get_backend(target)


def last_submitted_to(run_id: str | None) -> str | None:
    """Of the targets that remember their submissions, the one this machine submitted the run (without a run id:
    any run) to last."""
    found = [(Submissions(target).submitted_at(run_id), target) for target in REMEMBERED]
    found = [(when, target) for when, target in found if when is not None]
    return max(found)[1] if found else None
