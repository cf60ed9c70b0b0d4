"""The rules only a job on EKS has: its namespace, GPUs per pod, and outputs and data on the FSx volume the pods
mount. Pure: they read the job, never the cluster (preflight.py probes the cluster at submit)."""

from __future__ import annotations

import posixpath
from pathlib import PurePosixPath

from training.spec import Job
from trainkit import hardware
from trainkit.backends.eks import cluster
from trainkit.errors import SpecError
from trainkit.job.validate import DNS_LABEL, require


def check(job: Job) -> None:
    """What a job must satisfy to run as pods on the cluster (pure; after the target-free rules)."""
    placement, nproc = job.placement, job.parallelism.nproc
    namespace = placement.namespace or cluster.JOBS_NAMESPACE
    require(
        DNS_LABEL.fullmatch(namespace) is not None,
        f"--namespace {namespace}: a Kubernetes namespace is a DNS label (lower-case letters, digits and '-', at "
        "most 63, starting and ending with a letter or digit)",
    )
    gpus = hardware.INSTANCE_TYPES[placement.instance_type].gpus
    require(
        0 < nproc <= gpus,
        f"--nproc {nproc}: a {placement.instance_type} node has {gpus} GPUs; use --nproc 1..{gpus} (default: all)",
    )
    require(
        on_fsx(job.run.runs_dir),
        f"--runs-dir {job.run.runs_dir}: on EKS runs live on the FSx volume (the pods' {cluster.FSX_MOUNT}) and this "
        "path leaves it, so every output would be lost with the pods; give a path inside it (default `runs`)",
    )
    data = job.data.dataset
    require(
        on_fsx(data),  # a Hugging Face dataset name (`org/name`) or 'synthetic' resolves inside it too
        f"--dataset {data}: training pods read data from the FSx volume and this path leaves it; copy the data "
        f"there and give a path under {cluster.FSX_MOUNT} (or relative to it), a Hugging Face dataset name, or "
        "'synthetic'",
    )
    weights = job.model.weights if job.model.init == "pretrained" else None
    require(
        weights is None or (not weights.startswith("s3://") and on_fsx(weights)),
        f"--weights {weights}: training pods read model folders from the FSx volume and this path leaves it; copy "
        f"the folder there and give its absolute path under {cluster.FSX_MOUNT} (a relative owner/name is taken for "
        "a hub id), or a Hugging Face hub id",
    )
    held_out = job.evaluation.data
    require(
        held_out is None or on_fsx(held_out),
        f"--eval-data {held_out}: training pods read held-out records from the FSx volume and this path leaves it; "
        f"copy them there and give a path under {cluster.FSX_MOUNT} (or relative to it), or a Hugging Face dataset "
        "name",
    )


def on_fsx(path: str) -> bool:
    """Whether a path the pods resolve from their working directory (the FSx mount) stays on the volume: `..` and
    absolute paths are followed as the pods would, without touching this machine's files."""
    mount = PurePosixPath(cluster.FSX_MOUNT)
    resolved = PurePosixPath(posixpath.normpath(mount / path))
    return resolved == mount or resolved.is_relative_to(mount)


def fsx_relative(path: str, flag: str) -> str:
    """A path on the FSx volume, relative to its mount (the pod's working directory): /fsx/x or x -> x."""
    given = PurePosixPath(path)
    mount = PurePosixPath(cluster.FSX_MOUNT)
    if given.is_absolute():
        if mount not in given.parents:
            raise SpecError(
                f"{flag} {path}: on EKS the job writes to the FSx volume; give a path under {mount}, e.g. "
                f"{mount}/imagenet (training then reads it with --data {mount}/imagenet)"
            )
        given = given.relative_to(mount)
    if not given.parts or ".." in given.parts:
        raise SpecError(f"{flag} {path}: a folder under {mount}, e.g. {mount}/imagenet")
    return str(given)
