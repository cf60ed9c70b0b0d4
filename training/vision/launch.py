"""The vision family's launcher side (training/families.py `launch`): what the launcher checks and writes for an
image classifier's job before any worker starts. Imports neither torch nor PIL until it writes synthetic images."""

from __future__ import annotations

import json

from training.common.failure import SpecError
from training.common.files import publish_text
from training.families import VISION
from training.spec import MODEL_CONFIG, SYNTHETIC, Job, dataset_path
from training.vision.layout import CROP_RATIO, LayoutError, check_image_folder

SYNTHETIC_CLASSES = 10
"""Classes of the synthetic JPEG tree (`--dataset synthetic`)."""


def check_inputs(job: Job, entry) -> None:
    """A given ImageFolder tree has the layout the workers read (it says how to make one)."""
    if job.data.dataset == SYNTHETIC:
        return
    try:
        check_image_folder(dataset_path(job), flag=VISION.data_flag)
    except LayoutError as error:
        raise SpecError(str(error)) from None


def prepare(job: Job, entry) -> None:
    """The model's class count, and the synthetic JPEG tree for `--dataset synthetic` (not for --synthetic, whose
    batches are made on the device)."""
    publish_text(job.run_dir / MODEL_CONFIG, json.dumps({"num_classes": entry.arch.num_classes}) + "\n")
    if job.data.dataset == SYNTHETIC and not job.data.synthetic:
        from training.vision.synthetic import SyntheticTree, write_tree  # PIL: only where images are written

        size = round(job.data.image_size / CROP_RATIO)
        write_tree(job.run_dir / VISION.synthetic, SyntheticTree(classes=SYNTHETIC_CLASSES, size=size))
