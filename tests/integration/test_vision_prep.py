"""`invoke data.imagenet` against an S3 emulator (moto server on 127.0.0.1): real HTTP, real boto3 transfers."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import boto3
import pytest

from tests.helpers.aws import FAKE_AWS, moto_server
from tests.helpers.product import invoke, start_invoke
from training.vision.layout import FILE_DELAY_ENV, VAL_CSV_NAME, read_val_labels
from training.vision.prep import MANIFEST
from training.vision.synthetic import MARKER, SyntheticTree, write_tree

BUCKET, PREFIX = "datasets", "imagenet"


@pytest.fixture
def s3(tmp_path):
    """An emulator holding an ILSVRC-shaped tree (train/<wnid>/, flat val/, LOC_val_solution.csv)."""
    source = write_tree(tmp_path / "source", SyntheticTree(classes=5, per_class=20, val_per_class=8, flat_val=True))
    with moto_server(tmp_path / "moto.log") as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, **{k.lower(): v for k, v in FAKE_AWS.items() if "KEY" in k})
        client.create_bucket(Bucket=BUCKET)
        keys = {}
        for path in sorted(source.rglob("*")):
            if path.is_file() and path.name != MARKER:
                relative = str(path.relative_to(source))
                client.upload_file(str(path), BUCKET, f"{PREFIX}/{relative}")
                keys[relative] = path
        yield {"env": {"AWS_ENDPOINT_URL_S3": endpoint, **FAKE_AWS}, "client": client, "objects": keys}


def expected_tree(objects: dict[str, Path], labels: dict[str, str]) -> dict[str, bytes]:
    """Where each source object must land: val images inside their class folder, the rest as listed."""
    tree = {}
    for relative, path in objects.items():
        parts = relative.split("/")
        if parts[0] == "val":
            relative = f"val/{labels[Path(parts[1]).stem]}/{parts[1]}"
        tree[relative] = path.read_bytes()
    return tree


def local_tree(dest: Path) -> dict[str, bytes]:
    return {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file() and p.name != MANIFEST}


def prep(s3, dest: Path, *extra: str):
    return invoke("data.imagenet", "--source", f"s3://{BUCKET}/{PREFIX}", "--dest", str(dest), *extra, env=s3["env"])


def test_full_copy_lays_out_val_and_equals_the_source(s3, tmp_path):
    dest = tmp_path / "fsx" / "imagenet"
    result = prep(s3, dest, "--workers", "8")
    assert result.returncode == 0, result.stdout + result.stderr
    total = len(s3["objects"])  # 100 train + 40 val + the CSV
    assert f"copy: {total} objects listed" in result.stdout
    assert "val re-layout: moved 0, already in class folders 40" in result.stdout  # copied straight into classes
    assert f"ready: {dest} (5 classes)" in result.stdout
    labels = read_val_labels(s3["objects"][VAL_CSV_NAME])
    assert local_tree(dest) == expected_tree(s3["objects"], labels)
    assert not list(dest.rglob("*.part"))
    again = prep(s3, dest)
    assert again.returncode == 0 and f"0 copied (0.0 MB), {total} already present" in again.stdout


def test_a_copy_killed_mid_way_resumes_with_only_what_is_missing(s3, tmp_path):
    dest = tmp_path / "imagenet"
    args = ["data.imagenet", "--source", f"s3://{BUCKET}/{PREFIX}", "--dest", str(dest), "--workers", "2"]
    process = start_invoke(*args, env={**s3["env"], FILE_DELAY_ENV: "0.05"})
    deadline = time.monotonic() + 120
    while len(list(dest.rglob("*.JPEG"))) < 30:
        assert time.monotonic() < deadline and process.poll() is None, "copy never got going"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    present = {p: p.stat().st_ino for p in dest.rglob("*") if p.is_file() and not p.name.endswith(".part")}
    complete = len([p for p in present if p.name != MANIFEST])
    assert 30 <= complete < len(s3["objects"]), "the kill must land mid-way"

    result = prep(s3, dest)
    assert result.returncode == 0, result.stdout + result.stderr
    missing = len(s3["objects"]) - complete
    assert f"{missing} copied" in result.stdout and f"{complete} already present" in result.stdout
    assert all(p.stat().st_ino == inode for p, inode in present.items() if p.name != MANIFEST)  # not fetched again
    labels = read_val_labels(s3["objects"][VAL_CSV_NAME])
    assert local_tree(dest) == expected_tree(s3["objects"], labels)
    assert not list(dest.rglob("*.part"))


def test_an_object_changed_at_the_source_is_fetched_again(s3, tmp_path):
    dest = tmp_path / "imagenet"
    assert prep(s3, dest).returncode == 0
    relative = next(k for k in s3["objects"] if k.startswith("train/"))
    original = (dest / relative).read_bytes()
    changed = bytes(255 - b for b in original)  # same size, other content: only the ETag tells
    s3["client"].put_object(Bucket=BUCKET, Key=f"{PREFIX}/{relative}", Body=changed)
    result = prep(s3, dest)
    assert result.returncode == 0 and "1 copied" in result.stdout, result.stdout
    assert (dest / relative).read_bytes() == changed


def test_wrong_source_is_one_clear_sentence(s3, tmp_path):
    empty = invoke("data.imagenet", "--source", f"s3://{BUCKET}/nothing", "--dest", str(tmp_path / "d"), env=s3["env"])
    assert empty.returncode == 2 and f"nothing found under s3://{BUCKET}/nothing; check --source" in empty.stderr
    bad = invoke("data.imagenet", "--source", "/local/path", "--dest", str(tmp_path / "d"), env=s3["env"])
    assert bad.returncode == 2 and "--source '/local/path' must look like s3://bucket/prefix/" in bad.stderr


def test_without_a_label_csv_at_the_source_the_flat_val_is_laid_out_from_a_given_one(s3, tmp_path):
    s3["client"].delete_object(Bucket=BUCKET, Key=f"{PREFIX}/{VAL_CSV_NAME}")
    dest = tmp_path / "imagenet"
    copied = prep(s3, dest)
    assert copied.returncode == 2, copied.stdout + copied.stderr
    assert "40 images outside class folders" in copied.stderr and "--val-csv" in copied.stderr
    assert len(list((dest / "val").glob("*.JPEG"))) == 40  # the copy itself is complete; only the layout is not
    csv = s3["objects"][VAL_CSV_NAME]
    laid_out = invoke("data.imagenet", "--dest", str(dest), "--val-csv", str(csv), env=s3["env"])
    assert laid_out.returncode == 0, laid_out.stderr
    assert "val re-layout: moved 40" in laid_out.stdout and f"ready: {dest} (5 classes)" in laid_out.stdout
