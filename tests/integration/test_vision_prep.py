"""`invoke data.imagenet` against an S3 emulator (moto server on 127.0.0.1): real HTTP, real boto3 transfers."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import boto3
import pytest

from tests.helpers.aws import FAKE_AWS, moto_server
from tests.helpers.eks import IMAGE
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


def data_jobs(fake) -> dict:
    """The batch/v1 Jobs of the jobs' namespace (the platform's own, in trainkit-system, are not data jobs)."""
    return {key: job for key, job in fake.batch_jobs.items() if key[0] == "trainkit-jobs"}


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


def test_on_eks_the_copy_is_a_job_whose_pod_fills_fsx_and_follow_ends_with_its_result(s3, fake):
    """`--target eks --follow` against a cluster that runs batch/v1 Jobs as Kubernetes v1.33 does
    (tests/helpers/kube_api.py): the Job's pod runs the rendered command in the FSx folder with the emulator's
    credentials standing in for what EKS Pod Identity injects, copies and re-lays out the tree there, and the
    command streams its log and exits 0 once the Job is Complete."""
    fake.pod_env.update(s3["env"])
    source = f"s3://{BUCKET}/{PREFIX}"
    flags = ["--target", "eks", "--source", source, "--dest", "/fsx/imagenet", "--image", IMAGE, "--workers", "4"]
    result = invoke("data.imagenet", *flags, "--follow")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ((_, name),) = data_jobs(fake)
    assert f"submitted trainkit-jobs/{name}: {source} -> /fsx/imagenet" in result.stdout
    assert "ready: imagenet (5 classes)" in result.stdout and result.stdout.rstrip().endswith(": Complete")
    dest = fake.fsx / "imagenet"
    assert local_tree(dest) == expected_tree(s3["objects"], read_val_labels(dest / VAL_CSV_NAME))
    job = fake.batch_jobs[("trainkit-jobs", name)]
    assert [c["type"] for c in job["status"]["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    (pod,) = fake.pods.values()
    assert pod.manifest["spec"]["serviceAccountName"] == "trainkit-data" and pod.restarts == 0


def test_on_eks_a_destination_off_fsx_or_an_unreadable_bucket_is_refused_before_anything_is_created(
    recorded_outputs, fake
):
    off = invoke("data.imagenet", "--target", "eks", "--source", "s3://datasets/x", "--dest", "/data/imagenet")
    assert off.returncode == 2 and "give a path under /fsx, e.g. /fsx/imagenet" in off.stderr
    other = invoke("data.imagenet", "--target", "eks", "--source", "s3://elsewhere/x", "--dest", "/fsx/imagenet")
    assert other.returncode == 2 and '(datasets), not elsewhere: add "elsewhere" to data_source_buckets' in other.stderr
    local = invoke("data.imagenet", "--dest", "x", "--image", IMAGE)
    said = f"--image {IMAGE} is for --target eks, sagemaker or batch; drop it (or add --target)"
    assert local.returncode == 2 and said in local.stderr
    eks = ["data.imagenet", "--target", "eks", "--source", "s3://datasets/x", "--dest", "/fsx/imagenet"]
    csv = invoke(*eks, "--val-csv", "s3://elsewhere/LOC_val_solution.csv")
    assert csv.returncode == 2 and "not elsewhere" in csv.stderr
    namespace = invoke(*eks, "--namespace", "team-a")
    assert namespace.returncode == 2 and "the data job runs in trainkit-jobs" in namespace.stderr
    fake.service_accounts.clear()  # the platform stack not applied since the data job came
    account = invoke(*eks, "--image", IMAGE)
    assert account.returncode == 2 and "no service account trainkit-jobs/trainkit-data" in account.stderr
    assert not data_jobs(fake)


def test_on_eks_the_dry_run_is_a_valid_job_on_the_system_nodes_near_fsx(recorded_outputs, tmp_path):
    import kubernetes_validate
    import yaml

    from tests.helpers.kubernetes import kubernetes_version

    flags = ["--source", "s3://datasets/imagenet/", "--dest", "/fsx/imagenet", "--val-csv", "/fsx/labels.csv"]
    result = invoke("data.imagenet", "--target", "eks", *flags, "--dry-run", env={"KUBECONFIG": str(tmp_path / "x")})
    assert result.returncode == 0, result.stderr
    job = yaml.safe_load(result.stdout)
    kubernetes_validate.validate(job, kubernetes_version(), strict=True)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "training.vision.prep"] and container["workingDir"] == "/fsx"
    args = container["args"]
    assert args[args.index("--dest") + 1] == "imagenet" and args[args.index("--val-csv") + 1] == "labels.csv"
    assert pod["serviceAccountName"] == "trainkit-data" and pod["automountServiceAccountToken"] is False
    assert pod["nodeSelector"] == {"trainkit/pool": "system"} and "nvidia.com/gpu" not in container["resources"]
    (preferred,) = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["preference"]["matchExpressions"][0]["values"] == ["us-east-1b"]  # FSx's zone
    assert container["image"].endswith(":not-pushed") and job["spec"]["backoffLimit"] >= 1


@pytest.mark.parametrize(
    ("exit_code", "backoff_limit", "reason", "message"),
    [
        # prep's exit 2 (a wrong bucket, no access, a bad tree): the podFailurePolicy ends the Job, no retry
        (2, 3, "PodFailurePolicy", "failed with exit code 2 matching FailJob rule at index 0"),
        # anything else is retried until the back-off limit (0 here: one pod)
        (1, 0, "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
    ],
)
def test_following_a_data_job_whose_pods_fail_ends_with_the_controllers_reason(
    fake, exit_code, backoff_limit, reason, message
):
    from trainkit.backends.eks import render
    from trainkit.backends.eks import task as dataprep
    from trainkit.backends.eks.kube import Kube

    manifest = render.render_prep_job("prep-fails", "trainkit-jobs", IMAGE, ["--dest", "x"], "x", None)
    manifest["spec"]["backoffLimit"] = backoff_limit
    pod = manifest["spec"]["template"]["spec"]["containers"][0]
    pod["command"], pod["args"] = ["python", "-c", f"import sys; print('no such bucket'); sys.exit({exit_code})"], []
    kube = Kube.connect()
    kube.batch.create_namespaced_job("trainkit-jobs", manifest)
    lines = []
    assert dataprep.follow_job(kube, "trainkit-jobs", "prep-fails", lines.append, poll_s=0.2) == 1
    assert "no such bucket" in lines
    assert lines[-1].startswith(f"job trainkit-jobs/prep-fails: Failed ({reason}: ") and message in lines[-1]
    job = fake.batch_jobs[("trainkit-jobs", "prep-fails")]
    assert [c["type"] for c in job["status"]["conditions"]] == ["FailureTarget", "Failed"]
    assert (job["status"]["failed"], job["status"]["active"]) == (1, 0)


def test_a_second_copy_into_a_folder_another_data_job_is_writing_is_refused(fake):
    from trainkit.backends.eks import render
    from trainkit.backends.eks import task as dataprep
    from trainkit.backends.eks.kube import Kube

    label = dataprep.dest_label("imagenet")
    manifest = render.render_prep_job("prep-busy", "trainkit-jobs", IMAGE, [], label, None)
    manifest["spec"]["template"]["spec"]["containers"][0]["command"] = ["sleep", "30"]
    Kube.connect().batch.create_namespaced_job("trainkit-jobs", manifest)
    again = invoke("data.imagenet", "--target", "eks", "--source", "s3://datasets/x", "--dest", "/fsx/imagenet")
    assert again.returncode == 2 and "data job prep-busy is still writing /fsx/imagenet" in again.stderr
    other = invoke("data.imagenet", "--target", "eks", "--source", "s3://x/y", "--dest", "/fsx/other", "--image", IMAGE)
    assert other.returncode == 0, other.stderr  # another folder is fine
    assert len(data_jobs(fake)) == 2
