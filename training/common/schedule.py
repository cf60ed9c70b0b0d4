"""Learning-rate schedule shared by every workload."""

from __future__ import annotations

import math


def lr_multiplier(step: int, warmup: int, total: int, schedule: str) -> float:
    """Linear warmup to 1, then constant or cosine decay to 0.1 at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))
