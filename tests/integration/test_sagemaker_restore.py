"""A SageMaker host restarting its workers in place takes the other hosts' checkpoint parts from S3
(trainkit/backends/sagemaker/restore.py): real per-host checkpoints (training/common/checkpoint.py) uploaded to the
emulated S3 as SageMaker's sync puts them, one key per file under the checkpoint prefix."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers import sagemaker_standin
from tests.helpers.aws import in_process_bucket
from training.common.checkpoint import HOST_ENV, CheckpointManager, check_manifest, complete_steps
from training.spec import RUN_DIR_ENV
from trainkit.backends.aws import s3_parts
from trainkit.backends.sagemaker import restore as restore_module
from trainkit.backends.sagemaker.api import fetch_run_files
from trainkit.backends.sagemaker.request import checkpoint_prefix
from trainkit.backends.sagemaker.restore import CHECKPOINT_S3_ENV, before_restart, restore
from trainkit.backends.sagemaker.stack import PLACEHOLDER

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
    with in_process_bucket(BUCKET) as client:
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
    assert said == "step-00000020: 5 file(s) restored from S3 (all but this host's own part)"  # HOSTS, state too
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
    assert said == "step-00000010: 5 file(s) restored from S3 (step-00000020 never arrived whole within 0 s)"
    assert [p.name for p in complete_steps(here)] == ["step-00000010"]
    assert not (here / "step-00000020" / "shard-algo-2.bin").exists()  # nothing of the cut upload is taken
    assert not (here / "step-00000020" / "COMPLETE.algo-1").exists()  # no checkpoint now, here or in S3


def test_nothing_whole_in_s3_takes_nothing_and_withdraws_this_hosts_marker(s3, roots):
    save(roots, 10)
    upload(s3, roots["algo-1"])
    here = roots["algo-1"]
    before = sorted(p.relative_to(here) for p in here.rglob("*"))
    said = restore(here, BUCKET, PREFIX, "algo-1", s3, wait_s=0)
    assert said == "no checkpoint whole in S3 and here (step-00000010 never arrived whole)"
    marker = Path("step-00000010") / "COMPLETE.algo-1"
    assert sorted(p.relative_to(here) for p in here.rglob("*")) == [p for p in before if p != marker]


def test_a_copy_the_start_restored_is_not_taken_for_the_part_its_host_wrote_again(s3, roots):
    """A job's start restored step 20 with algo-2's part and marker but not algo-1's; both wrote it again. algo-1's
    copy of algo-2's part is the old one: the restore takes algo-2's part from S3."""
    save(roots, 20)
    old = roots["algo-2"] / "step-00000020"
    here = roots["algo-1"] / "step-00000020"
    for path in old.iterdir():  # the copy the start restored onto algo-1
        (here / path.name).write_bytes(path.read_bytes())
    (old / "shard-algo-2.bin").write_bytes(b"new!" * 6)  # algo-2 writes the step again, its new part uploaded
    (old / "MANIFEST.algo-2.json").write_text('{"shard-algo-2.bin": 24}')
    for root in roots.values():
        upload(s3, root)
    said = restore(roots["algo-1"], BUCKET, PREFIX, "algo-1", s3, wait_s=0)
    assert said.startswith("step-00000020: 5 file(s)")
    assert (here / "shard-algo-2.bin").read_bytes() == b"new!" * 6 and check_manifest(here) is None


def test_run_exp1_gets_none_of_exp10s_objects_at_the_start_or_a_restart_in_place(s3, tmp_path, monkeypatch):
    """SageMaker restores every object whose key starts with the CheckpointConfig.S3Uri's (syne-tune/syne-tune#363):
    the run's prefix ends in `/`, and every reader of it joins keys with one `/`."""
    uris = {run: checkpoint_prefix(replace(PLACEHOLDER, bucket=BUCKET), run) for run in ("exp1", "exp10")}
    for step, (run, uri) in enumerate(uris.items(), start=1):
        roots = {host: tmp_path / run / host for host in HOSTS}
        save(roots, step * 10)
        key = s3_parts(uri)[1].rstrip("/")  # SageMaker's sync joins it and a file's path with one `/`
        for root in roots.values():  # the run folder in LocalPath: <run>/checkpoints/...
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                name = f"{key}/{run}/checkpoints/{path.relative_to(root)}"
                s3.put_object(Bucket=BUCKET, Key=name, Body=path.read_bytes())
        s3.put_object(Bucket=BUCKET, Key=f"{key}/{run}/summary.json", Body=run.encode())
    assert uris["exp1"].endswith("/checkpoints/exp1/")

    # the job's start: the stand-in restores the prefix into LocalPath as SageMaker does
    local = tmp_path / "algo-1" / "opt" / "ml" / "checkpoints"
    standin = sagemaker_standin.Job.__new__(sagemaker_standin.Job)  # its S3 side only: no hosts, no network
    standin.clients = lambda service: s3
    standin._download(uris["exp1"], local)
    assert sorted({path.relative_to(local).parts[0] for path in local.rglob("*")}) == ["exp1"]
    assert [p.name for p in (local / "exp1" / "checkpoints").glob("step-*")] == ["step-00000010"]

    # a restart in place: the other host's parts of exp1's newest step, none of exp10's
    for path in (local / "exp1" / "checkpoints").rglob("*algo-2*"):
        path.unlink()
    monkeypatch.setenv(RUN_DIR_ENV, str(local / "exp1"))
    monkeypatch.setenv(CHECKPOINT_S3_ENV, uris["exp1"])
    monkeypatch.setenv(HOST_ENV, "algo-1")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr(restore_module, "restore", functools.partial(restore, wait_s=0))
    assert before_restart().startswith("step-00000010: ")
    assert [p.name for p in complete_steps(local / "exp1" / "checkpoints")] == ["step-00000010"]

    # the run's files `invoke obs.report` fetches
    described = {"CheckpointConfig": {"S3Uri": uris["exp1"]}}
    sagemaker = SimpleNamespace(describe_training_job=lambda TrainingJobName: described)
    clients = {"sagemaker": sagemaker, "s3": s3}.__getitem__
    assert fetch_run_files(clients, "job", "exp1", tmp_path / "report") == ["summary.json"]
    assert (tmp_path / "report" / "summary.json").read_text() == "exp1"
