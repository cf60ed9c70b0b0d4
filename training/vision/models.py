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

__all__ = ["build_model", "efficientnet_b7", "parameter_groups", "resnet50", "resnet_tiny"]


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
