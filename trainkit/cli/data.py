"""`invoke data.*`: ImageNet from S3 into the ImageFolder layout, and a small real-JPEG tree for tests."""

from __future__ import annotations

from invoke import Collection, Exit, task

from trainkit.backends.eks.cluster import JOBS_NAMESPACE
from trainkit.cli.options import user_errors
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
        "dry-run": "eks: print the Job as YAML and create nothing.",
        "follow": "eks: stream the Job's log until it ends; exit non-zero if it failed.",
    }
)
@user_errors
def imagenet(
    c,
    dest,
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
    from training.vision.layout import LayoutError
    from training.vision.prep import PrepError, prepare_imagenet

    if int(workers) < 1:
        raise SpecError(f"--workers must be a positive integer (got {workers})")
    if target == "eks":
        from trainkit.workloads import imagenet as dataprep

        code = dataprep.submit(source, dest, val_csv, int(workers), image, namespace, dry_run, follow)
        if code:
            raise Exit("the data job failed: its log above says why; submitting again resumes the copy", code=code)
        return
    if target != "local":
        raise SpecError(f"--target {target!r}: local or eks")
    given = [
        flag
        for flag, value in (("image", image), ("namespace", namespace), ("dry-run", dry_run), ("follow", follow))
        if value
    ]
    if given:
        raise SpecError(f"{', '.join('--' + flag for flag in given)}: for --target eks only")
    try:
        lines = prepare_imagenet(dest, source, val_csv, int(workers))
    except (PrepError, LayoutError) as error:
        raise SpecError(str(error)) from None
    for line in lines:
        print(line)


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
def synthetic_imagenet(c, dest, classes=10, per_class=40, val_per_class=10, size=40, seed=0, flat_val=False):
    """Write a small real-JPEG ImageNet-layout tree (train/<wnid>/, val/<wnid>/) for tests and the local demo."""
    from training.vision.layout import LayoutError, check_image_folder
    from training.vision.synthetic import SyntheticTree, write_tree

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
