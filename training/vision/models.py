"""Vision model builders, named by the registry (`training/registry.py`): torchvision's models with random
weights (nothing downloaded), each `num_classes -> torch.nn.Module`.

`resnet_tiny` is torchvision's ResNet with one BasicBlock per stage (a "ResNet-10"): the same stem, stages,
BatchNorm and head as ResNet50, small enough for 2-process DDP on a CPU.
"""

from __future__ import annotations

import torch
from torchvision import models
from torchvision.models.resnet import BasicBlock, ResNet

from training.common.trainer import parameter_groups
from training.registry import load, model_entry

__all__ = ["build_model", "efficientnet_b7", "parameter_groups", "resnet50", "resnet_tiny", "synced_batchnorm"]

SYNC_BATCHNORM_BELOW = 32
"""Images per GPU below which BatchNorm's statistics are gathered across the data-parallel ranks: BatchNorm's
error grows quickly below about 16 images per batch (Wu & He, "Group Normalization", 2018, Figure 1), and gradient
accumulation does not enlarge the batch BatchNorm sees (EfficientNet-B7's recipe: 8 images of 600 px)."""


def resnet50(num_classes: int) -> torch.nn.Module:
    return models.resnet50(weights=None, num_classes=num_classes)


def efficientnet_b7(num_classes: int) -> torch.nn.Module:
    return models.efficientnet_b7(weights=None, num_classes=num_classes)


def resnet_tiny(num_classes: int) -> torch.nn.Module:
    return ResNet(BasicBlock, [1, 1, 1, 1], num_classes=num_classes)


def build_model(name: str, num_classes: int) -> torch.nn.Module:
    """The registry's vision model `name`, built by the builder its entry names."""
    entry = model_entry(name)
    if entry.family != "vision":
        raise ValueError(f"--model {name!r} is a {entry.family} model, not a vision model")
    return load(entry.builder)(num_classes)


def synced_batchnorm(model: torch.nn.Module, micro_batch: int, world: int, device: torch.device) -> str | None:
    """Convert `model`'s BatchNorm layers to SyncBatchNorm (in place; returns the reason) when several GPU ranks
    each see fewer than SYNC_BATCHNORM_BELOW images: their statistics then come from every rank's micro batch.
    None, and no change, otherwise: torch's SyncBatchNorm runs on GPUs only (its forward refuses a CPU tensor)."""
    if world < 2 or micro_batch >= SYNC_BATCHNORM_BELOW or device.type != "cuda":
        return None
    converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if converted is not model:  # the model itself a BatchNorm: never for the registry's models
        raise ValueError("a bare BatchNorm layer is not a model")
    return f"synced across {world} ranks ({micro_batch} images per GPU, below {SYNC_BATCHNORM_BELOW})"
