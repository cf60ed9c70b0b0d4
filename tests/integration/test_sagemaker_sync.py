"""SageMaker's checkpoint sync as the stand-in runs it (tests/helpers/sagemaker_sync.py), against the emulated S3: the
Developer Guide's rules ("Checkpoints in Amazon SageMaker AI"), and trainkit's per-host checkpoints
(training/common/checkpoint.py) publishing on it so that no host deletes what another host wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import sagemaker_standin
from tests.helpers.aws import in_process_bucket
from tests.helpers.sagemaker_sync import CheckpointSync
from training.common.checkpoint import CheckpointManager, check_manifest, complete_steps

BUCKET = "trainkit-runs"
URI = f"s3://{BUCKET}/checkpoints/run/"
HOSTS = ("algo-1", "algo-2")


@pytest.fixture
def s3():
    with in_process_bucket(BUCKET) as client:
        yield client


def keys(s3) -> dict[str, bytes]:
    found = s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    return {item["Key"]: s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read() for item in found}


def start(s3, local: Path) -> CheckpointSync:
    """A fresh instance: the prefix copied in by the stand-in's own download, then the sync."""
    job = sagemaker_standin.Job.__new__(sagemaker_standin.Job)  # its S3 side only: no hosts, no network
    job.clients = lambda service: s3
    local.mkdir(parents=True)
    job._download(URI, local)
    return CheckpointSync(s3, URI, local)


def test_the_sync_mirrors_writes_and_deletions_and_copies_nothing_in_after_the_start(s3, tmp_path):
    s3.put_object(Bucket=BUCKET, Key="checkpoints/run/old/a.bin", Body=b"written by the other host")
    sync = start(s3, tmp_path / "ckpt")
    local = tmp_path / "ckpt"
    assert (local / "old" / "a.bin").read_bytes() == b"written by the other host"
    s3.put_object(Bucket=BUCKET, Key="checkpoints/run/late.bin", Body=b"added after the start")
    (local / "new").mkdir()
    (local / "new" / "b.bin").write_bytes(b"one")
    sync.push()
    assert keys(s3)["checkpoints/run/new/b.bin"] == b"one"
    (local / "new" / "b.bin").write_bytes(b"two")  # changed, the same size
    (local / "old" / "a.bin").unlink()  # a file the start copied in: deleted in S3, whoever wrote it
    sync.push()
    found = keys(s3)
    assert found["checkpoints/run/new/b.bin"] == b"two"
    assert "checkpoints/run/old/a.bin" not in found
    assert found["checkpoints/run/late.bin"] == b"added after the start"  # neither copied in nor deleted
    assert not (local / "late.bin").exists()
    (local / "new").rename(local / "renamed")  # this stand-in's reading: gone under the old name, new under the new
    sync.push()
    assert sorted(keys(s3)) == ["checkpoints/run/late.bin", "checkpoints/run/renamed/b.bin"]


def _save(root: Path, host: str, step: int, sync: CheckpointSync) -> None:
    """One host's local main rank saves its part of `step`; its sync makes a pass after every file it writes, so
    the order the keys reach S3 is the order they were written in."""
    manager = CheckpointManager(
        root, keep=2, is_main=host == "algo-1", barrier=sync.push, is_local_main=True, host=host, hosts=HOSTS
    )

    def write(directory: Path) -> None:
        (directory / f"shard-{host}.bin").write_bytes(f"{host}@{step}".encode() * 4)
        sync.push()

    manager.save(step, write, {})
    sync.push()


def test_per_host_checkpoints_publish_marker_last_and_prune_only_their_own_parts(s3, tmp_path):
    puts: list[str] = []
    put = s3.put_object
    s3.put_object = lambda **kwargs: puts.append(kwargs["Key"].removeprefix("checkpoints/run/")) or put(**kwargs)
    first = {host: start(s3, tmp_path / "attempt-0" / host) for host in HOSTS}
    for step in (10, 20):
        for host, sync in first.items():
            _save(sync.local, host, step, sync)
    order = [puts.index(f"step-00000020/{name}") for name in ("shard-algo-2.bin", "MANIFEST.algo-2.json")]
    assert order == sorted(order) and order[-1] < puts.index("step-00000020/COMPLETE.algo-2")
    assert not [key for key in puts if ".tmp" in key]  # nothing went up under a name it was not published as

    # a spot restart: every host gets the union, every host's files of both steps
    second = {host: start(s3, tmp_path / "attempt-1" / host) for host in HOSTS}
    here = second["algo-1"].local
    assert [p.name for p in complete_steps(here)] == ["step-00000010", "step-00000020"]
    _save(here, "algo-1", 30, second["algo-1"])  # algo-1 prunes step 10: its own part only
    found = keys(s3)
    assert "checkpoints/run/step-00000010/COMPLETE.algo-1" not in found
    assert "checkpoints/run/step-00000010/shard-algo-2.bin" in found  # algo-2's, until algo-2 prunes it
    assert (here / "step-00000010" / "shard-algo-2.bin").is_file()
    _save(second["algo-2"].local, "algo-2", 30, second["algo-2"])
    found = keys(s3)
    assert not [key for key in found if "step-00000010" in key]
    union = tmp_path / "attempt-2"
    start(s3, union)
    assert [p.name for p in complete_steps(union)] == ["step-00000020", "step-00000030"]
    assert check_manifest(union / "step-00000030") is None
