"""Which samples each rank reads at each optimizer step: a pure function of (seed, step).

Shared by every workload, so a resumed run reads exactly the batches an uninterrupted one would,
without replaying a data loader: the step number is the data position.
"""

from __future__ import annotations

import torch

from training.spec import micro_steps, share

from .failure import DataError


class StepSampler:
    """Epoch e uses permutation(seed + e); step s reads global positions [s*G, (s+1)*G) of the epoch,
    rank r takes its contiguous slice (`share`), split into `micro_steps` micro batches of at most the
    micro batch size (a smaller share gives smaller, possibly empty, ones). The trainers normalise the
    loss by the whole global batch, so the gradient does not depend on the split. A remainder of fewer
    than G samples at the end of an epoch is skipped (different each epoch).
    """

    def __init__(
        self,
        num_samples: int,
        global_batch: int,
        micro_batch: int,
        rank: int,
        world: int,
        seed: int,
        hint: str = "use more data or a smaller --global-batch-size",
    ):
        if num_samples < global_batch:
            raise DataError(f"dataset has {num_samples} samples, fewer than one global batch of {global_batch}; {hint}")
        self.num_samples, self.global_batch, self.micro_batch = num_samples, global_batch, micro_batch
        self.rank, self.world, self.seed = rank, world, seed
        self.steps_per_epoch = num_samples // global_batch
        self.micro_steps = micro_steps(global_batch, micro_batch, world)
        self._cached_epoch = -1
        self._order = torch.empty(0, dtype=torch.long)

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._cached_epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._order = torch.randperm(self.num_samples, generator=generator)
            self._cached_epoch = epoch
        return self._order

    def micro_batches(self, step: int) -> list[torch.Tensor]:
        """Sample indices for each micro batch this rank runs at `step` (0-based)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        order = self._permutation(epoch)
        offset, size = share(self.global_batch, self.world, self.rank)
        start = within * self.global_batch + offset
        mine = order[start : start + size]
        return list(mine.tensor_split(self.micro_steps))
