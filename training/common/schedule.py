"""Learning-rate schedule shared by every workload."""

from __future__ import annotations

import math


def lr_multiplier(step: int, warmup: int, total: int, schedule: str, floor: float = 0.1) -> float:
    """Linear warmup to 1, then constant or cosine decay from 1 at the first step after warmup to `floor` at the
    last (0-based `step`, `total` steps). Each family's floor: the trainer's LR_FLOOR."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - 1 - warmup))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
