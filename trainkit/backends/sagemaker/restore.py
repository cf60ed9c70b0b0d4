"""Before a SageMaker job's workers restart in place: the other hosts' parts of the newest checkpoint, from S3.

The hosts of a job share no disk. Each publishes its own part of a checkpoint (training/common/checkpoint.py,
per-host mode), and SageMaker uploads every host's checkpoint folder to the job's checkpoint prefix while the job
runs; it downloads the union onto every host only when a job, or a spot restart, starts (Developer Guide, "Use
checkpoints in Amazon SageMaker AI"). So when torchrun restarts the workers inside a job (the watchdog ended a
stalled rank, a rank crashed), each host's agent first calls `before_restart` (trainkit/run/agent.py,
RESTART_HOOK_ENV), which puts the parts this host lacks into its checkpoint folder, the way the job's start would:

- the step: the newest one this host published itself (its own `COMPLETE.<host>`: the hosts publish a step
  together, so the others' parts follow it to S3, an upload taking as long as its size needs); up to WAIT_S for
  them to arrive whole, then the newest step that S3 and this disk hold whole, if any;
- whole: in S3 the step's HOSTS file names its hosts, and each host's marker, manifest and every file the manifest
  lists at the size it records (a file still uploading is not yet); this host's own part may be here instead;
- from S3, every file but this host's own part, even where a copy is here: that copy is what the job's start
  restored, and its host may have written the step again since (checkpoint.py writes in place);
- written so a cut download is never mistaken for a checkpoint: each file under a temporary name renamed into place,
  the data first, the markers last (a step counts only once every host's marker is there);
- this host's marker withdrawn from the steps it published after the one restored: they are no checkpoint now (here,
  where resume takes the newest complete step, and in S3, where SageMaker deletes the marker too).

The job's role may read its checkpoint prefix (terraform/modules/sagemaker: ListRuns, ReadRuns). Tested on the
stand-in, which uploads like SageMaker (tests/e2e/test_sagemaker_runs.py: a stalled rank restarted in place).
Cloud-only: how long SageMaker takes to upload a large part after it is written (WAIT_S bounds the wait).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from training.common.checkpoint import (
    CHECKPOINTS_DIR,
    COMPLETE_MARKER,
    HOST_ENV,
    HOSTS_FILE,
    STATE_FILE,
    host_manifest,
    host_marker,
    is_bookkeeping,
)
from training.spec import RUN_DIR_ENV
from trainkit.backends.aws import s3_parts

CHECKPOINT_S3_ENV = "TRAINKIT_CHECKPOINT_S3"
"""The job's CheckpointConfig.S3Uri (trainkit/backends/sagemaker/request.py): what its LocalPath is mirrored to. The
run folder is `<LocalPath>/<run id>` (host.py), so its checkpoints are under `<S3Uri><run id>/checkpoints/` (the
S3Uri ends in `/`)."""
WAIT_S = 300.0
POLL_S = 1.0


class Remote:
    """One step folder's objects under the checkpoint prefix."""

    def __init__(self, s3, bucket: str, prefix: str):
        self.s3, self.bucket, self.prefix = s3, bucket, prefix

    def sizes(self) -> dict[str, int]:
        found = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix + "/"):
            for item in page.get("Contents", []):
                found[item["Key"][len(self.prefix) + 1 :]] = item["Size"]
        return found

    def read(self, name: str) -> bytes:
        return self.s3.get_object(Bucket=self.bucket, Key=f"{self.prefix}/{name}")["Body"].read()


def own_part_here(local: Path, host: str) -> bool:
    """This host's part of the step is here whole: its marker, and every file its manifest lists at that size."""
    marker, manifest = local / host_marker(host), local / host_manifest(host)
    if not (marker.is_file() and manifest.is_file()):
        return False
    files = json.loads(manifest.read_text())
    return all((local / name).is_file() and (local / name).stat().st_size == size for name, size in files.items())


def missing_parts(local: Path, remote: Remote, host: str) -> dict[str, int] | None:
    """{name: size} of the step's files to fetch: all but this host's own part when that is here whole, every one of
    them in S3; None when S3 (and this host's own part here) do not hold the step whole (yet)."""
    there = remote.sizes()
    if HOSTS_FILE not in there or STATE_FILE not in there:
        return None
    fetch = {HOSTS_FILE: there[HOSTS_FILE], STATE_FILE: there[STATE_FILE]}
    for name in remote.read(HOSTS_FILE).decode().split():
        if name == host and own_part_here(local, host):
            continue
        if host_marker(name) not in there or host_manifest(name) not in there:
            return None
        files = json.loads(remote.read(host_manifest(name)))
        if any(there.get(file) != size for file, size in files.items()):
            return None  # not uploaded yet, or still being uploaded
        fetch |= {file: there[file] for file in (*files, host_manifest(name), host_marker(name))}
    return fetch


def download(local: Path, remote: Remote, names: dict[str, int]) -> None:
    """Data first, bookkeeping after, the hosts' markers last; each file renamed into place once whole."""

    def order(name: str) -> tuple[int, str]:
        return (2 if name.startswith(COMPLETE_MARKER) else 1 if is_bookkeeping(name) else 0, name)

    for name in sorted(names, key=order):
        path = local / name
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{path.name}.part-{os.getpid()}")
        part.write_bytes(remote.read(name))
        part.replace(path)


def restore(checkpoints: Path, bucket: str, prefix: str, host: str, s3, wait_s: float = WAIT_S) -> str:
    """Make the newest step this host can have whole complete here (see the module's docstring); a line saying what
    it did."""

    def complete(name: str) -> int | None:
        """The step made whole here: how many files it took; None while S3 and this disk do not hold it whole."""
        remote = Remote(s3, bucket, f"{prefix}/{name}")
        fetch = missing_parts(checkpoints / name, remote, host)
        if fetch is not None:
            download(checkpoints / name, remote, fetch)
        return None if fetch is None else len(fetch)

    def settle(restored: str | None, line: str) -> str:
        for name in own:
            if restored is None or name > restored:  # published after the one restored: no checkpoint now
                (checkpoints / name / host_marker(host)).unlink(missing_ok=True)
        return line

    own = [p.name for p in checkpoints.glob("step-*") if (p / host_marker(host)).is_file()]
    newest = max(own, default=None)
    deadline = time.monotonic() + wait_s
    while newest is not None:
        fetched = complete(newest)
        if fetched is not None:
            return f"{newest}: {fetched} file(s) restored from S3 (all but this host's own part)"
        if time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    for name in sorted({*own, *_remote_steps(s3, bucket, prefix)} - {newest}, reverse=True):
        fetched = complete(name)
        if fetched is not None:
            line = f"{name}: {fetched} file(s) restored from S3 ({newest} never arrived whole within {wait_s:g} s)"
            return settle(name, line)
    return settle(None, f"no checkpoint whole in S3 and here{f' ({newest} never arrived whole)' if newest else ''}")


def _remote_steps(s3, bucket: str, prefix: str) -> list[str]:
    found = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/", Delimiter="/"):
        for common in page.get("CommonPrefixes", []):
            name = common["Prefix"][len(prefix) + 1 :].rstrip("/")
            if name.startswith("step-"):
                found.add(name)
    return sorted(found)


def before_restart() -> str:
    """The agent's hook: this host's checkpoint folder made whole from the job's checkpoint prefix."""
    import boto3

    run_dir = Path(os.environ[RUN_DIR_ENV])
    bucket, key = s3_parts(os.environ[CHECKPOINT_S3_ENV])
    prefix = "/".join(filter(None, (key.rstrip("/"), run_dir.name, CHECKPOINTS_DIR)))
    return restore(run_dir / CHECKPOINTS_DIR, bucket, prefix, os.environ[HOST_ENV], boto3.client("s3"))
