"""The vision family's launcher side (training/families.py `launch`): what the launcher checks and writes for an
image classifier's job before any worker starts. Imports neither torch nor PIL until it writes synthetic images
(or the bench counts FLOPs)."""

from __future__ import annotations

import json

from training.common.failure import SpecError
from training.common.files import publish_text
from training.families import VISION
from training.spec import MODEL_CONFIG, SYNTHETIC, Job, dataset_path
from training.vision.layout import CROP_RATIO, LayoutError, check_image_folder

SYNTHETIC_CLASSES = 10
"""Classes of the synthetic JPEG tree (`--dataset synthetic`)."""


def evaluates(job: Job) -> bool:
    """A vision job evaluates on its tree's val/ split, unless --synthetic feeds it no images at all."""
    return not job.data.synthetic


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


def flops_per_item(job: Job, config: dict) -> float:
    """Training FLOPs per image of the job's model at its crop (`invoke bench train`'s MFU); `config`: the run
    folder's model config (its class count)."""
    return flops_per_image(job.model.name, config["num_classes"], job.data.image_size)


def flops_per_image(model: str, classes: int, size: int) -> float:
    """Training FLOPs per image (forward + backward), counted by torch's FlopCounterMode on a batch of two (in
    training mode BatchNorm needs more than one value per channel). Imports torch: the bench's only."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from training.vision.models import build_model

    with torch.device("meta"):  # shapes only: nothing is computed or allocated
        net = build_model(model, classes)
        images = torch.randn(2, 3, size, size)
    with FlopCounterMode(display=False) as counter:
        net(images).sum().backward()
    return counter.get_total_flops() / 2
