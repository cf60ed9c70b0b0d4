"""`invoke data.*`: ImageNet from S3 into the ImageFolder layout, and a small real-JPEG tree for tests."""

from __future__ import annotations

from invoke import Collection

from trainkit.backends.eks.cluster import JOBS_NAMESPACE
from trainkit.cli.options import required, task, user_errors
from trainkit.errors import SpecError


@task(
    help={
        "dest": "Destination directory, the ImageFolder root (eks: a folder on the FSx volume, e.g. /fsx/imagenet).",
        "source": "s3://bucket/prefix/ holding train/<wnid>/, val/ (and LOC_val_solution.csv). Without it, only "
        "re-lay out and check --dest.",
        "val-csv": "LOC_val_solution.csv (an s3:// URL, or a path: local, or on FSx for eks); default: the one at "
        "the source root or in --dest.",
        "workers": "Parallel downloads (default 32).",
        "target": "local (here, default) or eks (a Kubernetes Job on the cluster, writing to FSx).",
        "image": "eks: the image to run (default: the training image `invoke images.push` recorded).",
        "namespace": f"eks: namespace of the Job (default {JOBS_NAMESPACE}).",
        "dry-run": "Print what would run and create nothing (local: the job and the task; eks: the Job as YAML).",
        "follow": "eks: stream the Job's log until it ends; exit non-zero if it failed (local: always so).",
    }
)
@user_errors
def imagenet(
    c,
    dest=None,
    source=None,
    val_csv=None,
    workers=32,
    target="local",
    image=None,
    namespace=None,
    dry_run=False,
    follow=False,
):
    """Copy ImageNet from S3 (parallel, resumable, retried), put val/ images into class folders, check the tree."""
    from trainkit.backends import resolve_job
    from trainkit.workloads import imagenet as copy

    required(dest, "--dest", "the folder to write the ImageFolder tree into")
    flags = {"workload": "data", "target": target, "image": image, "namespace": namespace, "nodes": 1, "nproc": 1}
    flags.update(run_id=copy.new_run_id(), max_restarts=0, metrics_port=0)
    job, backend, _ = resolve_job(flags)  # build drops the options left None
    task = copy.workload(job, backend, source, dest, val_csv, int(workers), follow=follow)
    backend.submit(job, task, dry_run=dry_run)  # a failed copy raises JobFailed: its cause, its exit code


@task(
    name="synthetic-imagenet",
    help={
        "dest": "Directory to create (must not exist, or be empty).",
        "classes": "Number of classes (default 10).",
        "per-class": "Training JPEGs per class (default 40).",
        "val-per-class": "Validation JPEGs per class (default 10).",
        "size": "Image side in pixels (default 40).",
        "seed": "Seed; the same settings always give the same images.",
        "flat-val": "Write val/ flat with LOC_val_solution.csv, as ILSVRC ships it.",
    },
)
@user_errors
def synthetic_imagenet(c, dest=None, classes=10, per_class=40, val_per_class=10, size=40, seed=0, flat_val=False):
    """Write a small real-JPEG ImageNet-layout tree (train/<wnid>/, val/<wnid>/) for tests and the local demo."""
    from training.vision.layout import LayoutError, check_image_folder
    from training.vision.synthetic import SyntheticTree, write_tree

    required(dest, "--dest", "the folder to create")
    try:
        tree = SyntheticTree(
            classes=classes, per_class=per_class, val_per_class=val_per_class, size=size, seed=seed, flat_val=flat_val
        )
        root = write_tree(dest, tree)
        if tree.flat_val:
            print(f"wrote {root} with a flat val/ and its label CSV; lay it out: invoke data.imagenet --dest {root}")
            return
        found = check_image_folder(root, flag="--dest")
    except LayoutError as error:
        raise SpecError(str(error)) from None
    images = tree.classes * (tree.per_class + tree.val_per_class)
    print(
        f"wrote {root}: {len(found)} classes, {images} JPEGs of {tree.size}px -> "
        f"invoke train --model resnet-tiny --data {root}"
    )


collection = Collection("data", imagenet, synthetic_imagenet)
