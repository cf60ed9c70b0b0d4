"""LAMB on a partition of flattened parameters, as ZeRO stage 1 hands the optimizer its share (issue 31).

ZeRO-1 (DeepSpeed's DeepSpeedZeroOptimizer) flattens each parameter group into one fp32 buffer and gives each
data-parallel rank one contiguous slice of it: a rank's optimizer sees a slice that may hold the end of one
parameter, several whole ones and the start of another. LAMB's step is elementwise except for its trust ratio,
||w|| / ||update|| per parameter (You et al. 2019, arXiv:1904.00962, algorithm 2): computed on a slice it would use
the norm of a piece, so a parameter cut in two would get two different ratios, and the result would depend on the
world size. Here each rank sums the squares of its pieces per parameter, the ranks add those sums (one small
all-reduce of two numbers per parameter), and every piece of a parameter is scaled by the whole parameter's
ratio: the same step as training/vision/lamb.py's on the unsharded parameters, at any world size.

`fragments` say what a slice holds: (parameter index in its group, offset in the slice, length). The reduction is
a function, so the step can be held against the unsharded optimizer in one process (the tests add the ranks'
sums themselves).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Fragment:
    param: int
    """The parameter's index in its group (the same on every rank)."""
    offset: int
    """Where its piece starts in this rank's slice."""
    length: int


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    dist.all_reduce(values)
    return values


@torch.no_grad()
def lamb_slice_step(
    weights: torch.Tensor,
    grads: torch.Tensor,
    state: dict,
    fragments: list[Fragment],
    params: int,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
    weight_decay: float = 0.0,
    adapt: bool = True,
    reduce: Callable[[torch.Tensor], torch.Tensor] = all_reduce_sum,
) -> None:
    """One LAMB step on this rank's slice `weights` (1-D fp32, updated in place) with its gradient slice; `state`
    holds the slice's moments; `params` is how many parameters the group has (the length of the reduced sums).
    Every rank of the group must call it at each step (the reduction is collective), with or without pieces."""
    beta1, beta2 = betas
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(weights)
        state["exp_avg_sq"] = torch.zeros_like(weights)
    state["step"] += 1
    t = state["step"]
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    grad = grads.float()
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    update = (exp_avg / (1 - beta1**t)) / ((exp_avg_sq / (1 - beta2**t)).sqrt() + eps)
    if weight_decay:
        update.add_(weights, alpha=weight_decay)
    scale = torch.ones_like(weights)
    if adapt:
        sums = torch.zeros(2, params, dtype=torch.float64, device=weights.device)  # ||w||^2, ||u||^2 per parameter
        for piece in fragments:
            window = slice(piece.offset, piece.offset + piece.length)
            sums[0, piece.param] += weights[window].double().square().sum()
            sums[1, piece.param] += update[window].double().square().sum()
        sums = reduce(sums)
        weight_norm, update_norm = sums[0].sqrt(), sums[1].sqrt()
        trust = torch.where(
            (weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, torch.ones_like(weight_norm)
        )
        for piece in fragments:
            scale[piece.offset : piece.offset + piece.length] = trust[piece.param]  # no host sync per piece
    weights.sub_(update * scale * lr)


def slice_fragments(sizes: list[int], start: int, length: int) -> list[Fragment]:
    """What the slice [start, start + length) of a group flattened from parameters of `sizes` holds."""
    found, position = [], 0
    for index, size in enumerate(sizes):
        low, high = max(position, start), min(position + size, start + length)
        if low < high:
            found.append(Fragment(index, low - start, high - low))
        position += size
    return found
