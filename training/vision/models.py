"""Vision models by registry name, built from torchvision with random weights (nothing downloaded).

`resnet-tiny` is torchvision's ResNet with one BasicBlock per stage (a "ResNet-10"): the same stem,
stages, BatchNorm and head as ResNet50, small enough for 2-process DDP on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchvision import models
from torchvision.models.resnet import BasicBlock, ResNet


def _resnet_tiny(num_classes: int) -> torch.nn.Module:
    return ResNet(BasicBlock, [1, 1, 1, 1], num_classes=num_classes)


BUILDERS: dict[str, Callable[[int], torch.nn.Module]] = {
    "resnet50": lambda num_classes: models.resnet50(weights=None, num_classes=num_classes),
    "efficientnet-b7": lambda num_classes: models.efficientnet_b7(weights=None, num_classes=num_classes),
    "resnet-tiny": _resnet_tiny,
}


def build_model(name: str, num_classes: int) -> torch.nn.Module:
    if name not in BUILDERS:
        raise ValueError(f"--model-name {name!r} is not a vision model; choose one of: {', '.join(BUILDERS)}")
    return BUILDERS[name](num_classes)


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on conv and linear weights only; biases and normalisation parameters are exempt
    (their `adapt` flag also keeps them out of LAMB's layer-wise trust ratio)."""
    decay, exempt = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim > 1 else exempt).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay, "adapt": True},
        {"params": exempt, "weight_decay": 0.0, "adapt": False},
    ]
