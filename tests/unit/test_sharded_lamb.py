"""LAMB on ZeRO-1 slices (training/common/sharded_lamb.py) takes the same steps as LAMB on whole parameters
(training/vision/lamb.py): each parameter's trust ratio uses its whole norm, added up over the ranks that hold its
pieces, at any world size. The ranks run as threads here, their all-reduce a barrier that adds their sums."""

from __future__ import annotations

import threading

import pytest
import torch

from training.common.sharded_lamb import Fragment, lamb_slice_step, slice_fragments
from training.vision.lamb import Lamb

SHAPES = [(3, 2), (10,), (3,), (7, 1), (4, 4)]
STEPS = 4


def parameters() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator) for shape in SHAPES]


def gradients(step: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=generator) for shape in SHAPES]


def whole(adapt: bool, weight_decay: float) -> list[torch.Tensor]:
    params = [torch.nn.Parameter(p.clone()) for p in parameters()]
    optimizer = Lamb([{"params": params, "adapt": adapt, "weight_decay": weight_decay}], lr=0.05)
    for step in range(STEPS):
        for param, grad in zip(params, gradients(step), strict=True):
            param.grad = grad
        optimizer.step()
    return [p.detach() for p in params]


class Ranks:
    """The all-reduce of `world` threads: each adds its sums, waits for the others, gets the total."""

    def __init__(self, world: int):
        self.barrier, self.lock, self.total, self.arrived = threading.Barrier(world), threading.Lock(), None, 0

    def reduce(self, values: torch.Tensor) -> torch.Tensor:
        with self.lock:
            self.total = values.clone() if self.total is None else self.total + values
        self.barrier.wait()
        total = self.total.clone()
        if self.barrier.wait() == 0:
            self.total = None  # the next step's sums start afresh
        self.barrier.wait()
        return total


def sharded(world: int, adapt: bool, weight_decay: float) -> list[torch.Tensor]:
    sizes = [p.numel() for p in parameters()]
    flat = torch.cat([p.flatten() for p in parameters()])
    share = -(-flat.numel() // world)  # DeepSpeed pads the flat group to a multiple of the world; slices equal
    bounds = [(r * share, min(share, flat.numel() - r * share)) for r in range(world)]
    ranks, states = Ranks(world), [{} for _ in range(world)]

    def run(rank: int) -> None:
        start, length = bounds[rank]
        pieces = slice_fragments(sizes, start, length)
        for step in range(STEPS):
            grads = torch.cat([g.flatten() for g in gradients(step)])[start : start + length]
            lamb_slice_step(
                flat[start : start + length],
                grads,
                states[rank],
                pieces,
                len(sizes),
                lr=0.05,
                weight_decay=weight_decay,
                adapt=adapt,
                reduce=ranks.reduce,
            )

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [piece.view(shape) for piece, shape in zip(flat.split(sizes), SHAPES, strict=True)]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize(("adapt", "weight_decay"), [(True, 0.01), (False, 0.0)])
def test_slices_take_the_steps_whole_parameters_take(world, adapt, weight_decay):
    expected = whole(adapt, weight_decay)
    for got, want in zip(sharded(world, adapt, weight_decay), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_slices_own_norm_would_not_do():
    """The check is sharp: the trust ratio of a parameter cut in two, taken per piece, changes the step."""
    sizes = [p.numel() for p in parameters()]
    flat = torch.cat([p.flatten() for p in parameters()])
    cut = sizes[0] + 4  # inside the second parameter
    for start, length in ((0, cut), (cut, flat.numel() - cut)):
        lamb_slice_step(
            flat[start : start + length],
            torch.cat([g.flatten() for g in gradients(0)])[start : start + length],
            {},
            slice_fragments(sizes, start, length),
            len(sizes),
            lr=0.05,
            weight_decay=0.01,
            reduce=lambda values: values,  # each rank alone: its pieces' norms only
        )
    params = [torch.nn.Parameter(p.clone()) for p in parameters()]
    optimizer = Lamb([{"params": params, "weight_decay": 0.01}], lr=0.05)
    for param, grad in zip(params, gradients(0), strict=True):
        param.grad = grad
    optimizer.step()
    second = flat.split(sizes)[1]
    assert not torch.allclose(second, params[1].detach().flatten(), rtol=1e-5, atol=1e-6)


def test_a_slice_knows_which_pieces_it_holds():
    assert slice_fragments([6, 10, 3], 4, 8) == [Fragment(0, 0, 2), Fragment(1, 2, 6)]
    assert slice_fragments([6, 10, 3], 16, 3) == [Fragment(2, 0, 3)]
    assert slice_fragments([6, 10, 3], 19, 2) == []  # padding past the last parameter
