"""A SageMaker host restarting its workers in place takes the other hosts' checkpoint parts from S3
(trainkit/backends/sagemaker/restore.py): real per-host checkpoints (training/common/checkpoint.py) uploaded to the
emulated S3 as SageMaker's sync puts them, one key per file under the checkpoint prefix."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from training.common.checkpoint import CheckpointManager, check_manifest, complete_steps
from trainkit.backends.sagemaker.restore import restore

BUCKET, PREFIX = "trainkit-runs", "checkpoints/run/run/checkpoints"
HOSTS = ("algo-1", "algo-2")


def save(roots: dict[str, Path], step: int) -> None:
    """Every host's local main rank saves its part of `step` (the barriers are each other's order here)."""
    for host, root in roots.items():
        manager = CheckpointManager(
            root, keep=3, is_main=host == "algo-1", barrier=lambda: None, is_local_main=True, host=host, hosts=HOSTS
        )
        manager.save(step, lambda tmp, h=host: (tmp / f"shard-{h}.bin").write_bytes(h.encode() * 4), {"step": step})


def upload(s3, root: Path) -> None:
    """What SageMaker's sync puts in the prefix from one host's checkpoint folder."""
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{path.relative_to(root)}", Body=path.read_bytes())


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


@pytest.fixture
def roots(tmp_path):
    return {host: tmp_path / host for host in HOSTS}


def reads(s3) -> list[str]:
    """The file names the restore reads, in order (the client's get_object, recorded)."""
    seen: list[str] = []
    get = s3.get_object

    def recorded(**kwargs):
        seen.append(kwargs["Key"].rsplit("/", 1)[-1])
        return get(**kwargs)

    s3.get_object = recorded
    return seen


def test_the_other_hosts_part_of_the_newest_step_arrives_data_first_markers_last(s3, roots):
    save(roots, 10)
    save(roots, 20)
    for root in roots.values():
        upload(s3, root)
    here = roots["algo-1"]
    assert complete_steps(here) == []  # alone, a host's parts are no checkpoint
    seen = reads(s3)
    said = restore(here, BUCKET, PREFIX, "algo-1", s3, wait_s=0)
    assert said == "step-00000020: 3 file(s) of the other hosts' parts restored from S3"
    assert [p.name for p in complete_steps(here)] == ["step-00000020"]
    assert check_manifest(here / "step-00000020") is None
    assert (here / "step-00000020" / "shard-algo-2.bin").read_bytes() == b"algo-2" * 4
    fetched = [name for name in seen if name in ("shard-algo-2.bin", "MANIFEST.algo-2.json", "COMPLETE.algo-2")]
    assert fetched[-1] == "COMPLETE.algo-2" and fetched.index("shard-algo-2.bin") < fetched.index("COMPLETE.algo-2")
    assert not list(here.rglob(".*.part-*"))
    # the other host, which lacks the main host's state and HOSTS as well
    said = restore(roots["algo-2"], BUCKET, PREFIX, "algo-2", s3, wait_s=0)
    assert said.startswith("step-00000020: 5 file(s)") and complete_steps(roots["algo-2"])[-1].name == "step-00000020"


def test_a_part_still_uploading_is_waited_for_then_the_newest_whole_step_is_taken(s3, roots):
    save(roots, 10)
    for root in roots.values():
        upload(s3, root)
    save(roots, 20)
    upload(s3, roots["algo-1"])
    other = roots["algo-2"] / "step-00000020"
    for name in ("shard-algo-2.bin", "MANIFEST.algo-2.json", "COMPLETE.algo-2"):  # its shard half-uploaded so far
        body = (other / name).read_bytes()
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/step-00000020/{name}", Body=body[:3] if "shard" in name else body)
    here = roots["algo-1"]
    said = restore(here, BUCKET, PREFIX, "algo-1", s3, wait_s=0)
    assert said == "step-00000010: 3 file(s) restored from S3 (step-00000020 never arrived whole within 0 s)"
    assert [p.name for p in complete_steps(here)] == ["step-00000010"]
    assert not (here / "step-00000020" / "shard-algo-2.bin").exists()  # nothing of the cut upload is taken


def test_nothing_whole_in_s3_leaves_the_folder_as_it_was(s3, roots):
    save(roots, 10)
    upload(s3, roots["algo-1"])
    here = roots["algo-1"]
    before = sorted(p.relative_to(here) for p in here.rglob("*"))
    said = restore(here, BUCKET, PREFIX, "algo-1", s3, wait_s=0)
    assert said == "no checkpoint whole in S3 and here (step-00000010 never arrived whole)"
    assert sorted(p.relative_to(here) for p in here.rglob("*")) == before
