"""`invoke data.imagenet`: ImageNet from S3 into the ImageFolder layout, as a workload any backend runs.

A task (one process, no torchrun): `python -m training.vision.prep` (parallel, resumable, retried copy; val/ into
class folders; the tree checked). Locally it runs here in the foreground; on EKS as a Kubernetes Job on a CPU
node writing to FSx, as the data service account (trainkit/backends/eks/task.py). The destination and a label
file on disk are paths as the target's processes see them (`Backend.path_for`: on EKS, under the FSx mount); the
S3 URLs it reads are named so a target can check it may read them before anything is created.
"""

from __future__ import annotations

import time
import uuid

from training.spec import Job
from trainkit.backends.base import Backend
from trainkit.errors import SpecError
from trainkit.run.workload import Workload


def new_run_id() -> str:
    return f"data-imagenet-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:4]}"


def prep_args(source: str | None, dest: str, val_csv: str | None, workers: int) -> list[str]:
    args = ["--dest", dest, "--workers", str(workers)]
    if source:
        args[:0] = ["--source", source]
    if val_csv:
        args += ["--val-csv", val_csv]
    return args


def workload(
    job: Job,
    backend: Backend,
    source: str | None,
    dest: str,
    val_csv: str | None,
    workers: int,
    follow: bool = False,
) -> Workload:
    """The copy (or, without a source, the re-layout and check) of `dest`, as the job's target sees its paths."""
    if workers < 1:
        raise SpecError(f"--workers must be a positive integer (got {workers})")
    on_s3 = bool(val_csv and val_csv.startswith("s3://"))
    target_dest = backend.path_for(job, dest, "--dest")
    csv = val_csv if on_s3 or not val_csv else backend.path_for(job, val_csv, "--val-csv")
    reads = {flag: url for flag, url in (("--source", source), ("--val-csv", val_csv if on_s3 else None)) if url}
    return Workload(
        label="imagenet",
        module="training.vision.prep",
        args=tuple(prep_args(source, target_dest, csv, workers)),
        prepare="trainkit.run.prepare:prepare_nothing",
        distributed=False,
        token=False,
        reads=reads,
        writes=target_dest,
        follow=follow,
    )
