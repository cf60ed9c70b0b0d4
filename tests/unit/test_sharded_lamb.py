"""LAMB on ZeRO-1 slices (training/common/sharded_lamb.py) takes the same steps as LAMB on whole parameters
(training/common/lamb.py): each parameter's trust ratio uses its whole norm, added up over the ranks that hold its
pieces, at any world size. The ranks run as threads here, their all-reduce a barrier that adds their sums."""

from __future__ import annotations

import threading

import pytest
import torch

from training.common.lamb import Lamb
from training.common.sharded_lamb import Fragment, PartitionLamb, lamb_slice_step, partition_fragments, slice_fragments

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


def test_padding_between_parameters_belongs_to_none():
    # DeepSpeed aligns each parameter's start in the flat buffer (stage_1_and_2.py round_robin_bit16_offsets)
    assert partition_fragments([0, 8, 20], [6, 10, 3], 4, 8) == [Fragment(0, 0, 2), Fragment(1, 4, 4)]
    assert partition_fragments([0, 8, 20], [6, 10, 3], 6, 2) == []


def partition_lamb(world: int) -> list[torch.Tensor]:
    """PartitionLamb as DeepSpeed drives it: two groups (decay + trust ratio, exempt), each flattened with a gap of
    padding after every parameter, one slice per rank, and the groups stepped one at a time (DeepSpeed sets
    `param_groups` to the group it steps)."""
    params = parameters()
    groups = [[0, 1, 3, 4], [2]]  # matrices and the vector of 10 decay; the 3-vector is exempt
    ranks, results = Ranks(world), {}

    def layout(indices: list[int]) -> tuple[list[int], list[int], int]:
        sizes = [params[i].numel() for i in indices]
        offsets = [sum(sizes[:k]) + 2 * k for k in range(len(sizes))]  # 2 elements of padding after each
        share = -(-(offsets[-1] + sizes[-1]) // world)
        return offsets, sizes, share

    def run(rank: int) -> None:
        flats, held = [], []
        for indices in groups:
            offsets, sizes, share = layout(indices)
            flat = torch.zeros(share * world)
            for i, offset in zip(indices, offsets, strict=True):
                flat[offset : offset + params[i].numel()] = params[i].flatten()
            flats.append((flat, offsets, sizes, share))
            held.append(torch.nn.Parameter(flat[rank * share : (rank + 1) * share].clone()))
        optimizer = PartitionLamb(
            [{"params": [held[0]], "weight_decay": 0.01}, {"params": [held[1]], "weight_decay": 0.0, "adapt": False}],
            lr=0.05,
        )
        bound = [
            (partition_fragments(offsets, sizes, rank * share, share), len(sizes)) for _, offsets, sizes, share in flats
        ]
        optimizer.bind(bound, ranks.reduce)
        every = optimizer.param_groups
        for step in range(STEPS):
            grads = gradients(step)
            for group, (indices, (_, offsets, _sizes, share)) in enumerate(zip(groups, flats, strict=True)):
                grad = torch.zeros(share * world)
                for i, offset in zip(indices, offsets, strict=True):
                    grad[offset : offset + grads[i].numel()] = grads[i].flatten()
                held[group].grad = grad[rank * share : (rank + 1) * share].clone()
            for group in every:
                optimizer.param_groups = [group]
                optimizer.step()
            optimizer.param_groups = every
        results[rank] = (held, flats)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out: dict[int, torch.Tensor] = {}
    for g, indices in enumerate(groups):
        _, offsets, sizes, share = results[0][1][g]
        flat = torch.cat([results[rank][0][g].detach() for rank in range(world)])
        for i, offset in zip(indices, offsets, strict=True):
            out[i] = flat[offset : offset + params[i].numel()].view(SHAPES[i])
    return [out[i] for i in range(len(params))]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_partition_lamb_on_padded_slices_takes_lambs_steps(world):
    whole_params = [torch.nn.Parameter(p.clone()) for p in parameters()]
    reference = Lamb(
        [
            {"params": [whole_params[i] for i in (0, 1, 3, 4)], "weight_decay": 0.01},
            {"params": [whole_params[2]], "weight_decay": 0.0, "adapt": False},
        ],
        lr=0.05,
    )
    for step in range(STEPS):
        for param, grad in zip(whole_params, gradients(step), strict=True):
            param.grad = grad
        reference.step()
    for got, want in zip(partition_lamb(world), whole_params, strict=True):
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)


def test_partition_lamb_refuses_a_partition_it_was_not_bound_to():
    optimizer = PartitionLamb([torch.nn.Parameter(torch.ones(4))], lr=0.1)
    with pytest.raises(RuntimeError, match="not bound"):
        optimizer.step()
