"""LAMB on a partition of flattened parameters, as ZeRO stage 1 hands the optimizer its share (issue 31).

ZeRO-1 (DeepSpeed's DeepSpeedZeroOptimizer) flattens each parameter group into one fp32 buffer and gives each
data-parallel rank one contiguous slice of it: a rank's optimizer sees a slice that may hold the end of one
parameter, several whole ones and the start of another. LAMB's step is elementwise except for its trust ratio,
||w|| / ||update|| per parameter (You et al. 2019, arXiv:1904.00962, algorithm 2): computed on a slice it would use
the norm of a piece, so a parameter cut in two would get two different ratios, and the result would depend on the
world size. Here each rank sums the squares of its pieces per parameter, the ranks add those sums (one small
all-reduce of two numbers per parameter), and every piece of a parameter is scaled by the whole parameter's
ratio: the same step as training/common/lamb.py's on the unsharded parameters, at any world size.

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
    offsets = [sum(sizes[:index]) for index in range(len(sizes))]
    return partition_fragments(offsets, sizes, start, length)


def partition_fragments(offsets: list[int], sizes: list[int], start: int, length: int) -> list[Fragment]:
    """What the slice [start, start + length) of a flat buffer holds, parameter i lying at [offsets[i], offsets[i] +
    sizes[i]) (DeepSpeed may pad between parameters for alignment: padding belongs to no parameter)."""
    found = []
    for index, (offset, size) in enumerate(zip(offsets, sizes, strict=True)):
        low, high = max(offset, start), min(offset + size, start + length)
        if low < high:
            found.append(Fragment(index, low - start, high - low))
    return found


class PartitionLamb(torch.optim.Optimizer):
    """LAMB as ZeRO-1's basic optimizer. Built on the model's parameter groups (their `weight_decay` and `adapt`, as
    training/common/trainer.py's `parameter_groups` gives them); DeepSpeed then replaces each group's parameters by this
    rank's flat fp32 partition, and `bind` says what each partition holds (training/common/zero.py reads it from
    DeepSpeed's optimizer). Its state per partition is `step`, `exp_avg`, `exp_avg_sq`: Adam's names, which
    DeepSpeed's checkpoint tools know."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.0):
        if lr <= 0:
            raise ValueError(f"lr must be positive (got {lr})")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "adapt": True}
        super().__init__(params, defaults)
        self.layout: dict[torch.Tensor, tuple[list[Fragment], int]] = {}
        self.reduce: Callable[[torch.Tensor], torch.Tensor] = all_reduce_sum

    def bind(self, layout: list[tuple[list[Fragment], int]], reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Per group, in order: the fragments of this rank's partition and how many parameters the group has;
        `reduce` adds the ranks' per-parameter sums (an all-reduce over the group's data-parallel ranks). Kept by
        partition, not by position: DeepSpeed steps one group at a time (it sets `param_groups` to that group)."""
        if len(layout) != len(self.param_groups):
            raise ValueError(f"{len(layout)} partition layouts for {len(self.param_groups)} parameter groups")
        for group, held in zip(self.param_groups, layout, strict=True):
            if len(group["params"]) != 1:
                raise ValueError("PartitionLamb.bind: each group must hold one flat partition (DeepSpeed ZeRO-1's)")
            self.layout[group["params"][0]] = held
        self.reduce = reduce

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            (flat,) = group["params"]
            if flat not in self.layout:
                raise RuntimeError("PartitionLamb steps a partition it was not bound to (training/common/zero.py)")
            fragments, params = self.layout[flat]
            grad = flat.grad if flat.grad is not None else torch.zeros_like(flat)
            lamb_slice_step(
                flat,
                grad,
                self.state[flat],
                fragments,
                params,
                lr=group["lr"],
                betas=group["betas"],
                eps=group["eps"],
                weight_decay=group["weight_decay"],
                adapt=group["adapt"],
                reduce=self.reduce,
            )
