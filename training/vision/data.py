"""The ImageNet input pipeline: ImageFolder + standard transforms, read in the order of a StepSampler.

Augmentation is seeded per (epoch, image): the crop and flip an image gets do not depend on which
loader worker or which process reads it, so a resumed run sees exactly the pixels an uninterrupted
one would. The train loader is iterated once for the whole run (its workers live as long as the
run); the validation loader is made once and keeps its workers across epochs.

Loader workers are spawned (a fresh interpreter), never forked from the training process: that process
has threads (Gloo/NCCL, the metrics server, loader queue feeders), and a fork while one of them holds
an interpreter lock leaves the child blocked for ever. Seen on CPython 3.11 in CI: the child stuck in
`PyOS_AfterFork_Child` -> `_PyThreadState_DeleteExcept` waiting on the runtime's thread-state lock,
the job silent at an epoch's evaluation (Python 3.14 stops defaulting to fork on Linux for the same
reason). Not the fork server either: its workers' parent is the server, which outlives a killed trainer,
so torch's parent-death check in the worker never fires and the workers are left behind. A spawned
worker's parent is the trainer; it exits within seconds of the trainer's death. Cost: each worker
imports torch once at start (~4 s more for the two-process resnet-tiny run on two cores).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torchvision import datasets, transforms

from training.common.sampling import StepSampler

from .layout import CROP_RATIO

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def train_transform(size: int) -> transforms.Compose:
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(size, antialias=True),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def val_transform(size: int) -> transforms.Compose:
    return transforms.Compose(
        [
            transforms.Resize(round(size / CROP_RATIO), antialias=True),
            transforms.CenterCrop(size),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


class ClassFolder(datasets.ImageFolder):
    """ImageFolder whose class list is given (train's), so val/ with a subset of classes keeps train's labels."""

    def __init__(self, root: str, classes: list[str], transform=None):
        self._given = classes
        super().__init__(root, transform=transform)

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        present = set(datasets.folder.find_classes(directory)[0])
        classes = [name for name in self._given if name in present]
        return classes, {name: self._given.index(name) for name in classes}


def _mix(seed: int, epoch: int, index: int) -> int:
    return (seed * 1_000_003 + epoch * 998_244_353 + index) % (2**63 - 1)


class SeededImages(Dataset):
    """Items are keyed (epoch, index); the transform's random draws are seeded from the key."""

    def __init__(self, folder: datasets.ImageFolder, seed: int):
        self.folder, self.seed = folder, seed

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        epoch, index = key
        torch.manual_seed(_mix(self.seed, epoch, index))
        return self.folder[index]


class StepBatches(Sampler[list[tuple[int, int]]]):
    """Micro batches of this rank for steps start..end-1, in order, keyed for SeededImages."""

    def __init__(self, sampler: StepSampler, start: int, end: int):
        self.sampler, self.start, self.end = sampler, start, end

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for step in range(self.start, self.end):
            epoch = self.sampler.epoch_of(step)
            for micro in self.sampler.micro_batches(step):
                yield [(epoch, int(i)) for i in micro]

    def __len__(self) -> int:
        return (self.end - self.start) * self.sampler.micro_steps


def worker_context() -> multiprocessing.context.BaseContext:
    return multiprocessing.get_context("spawn")  # not fork, not forkserver: see the module's docstring


def loader_options(workers: int, on_gpu: bool) -> dict:
    options: dict = {"num_workers": workers, "pin_memory": on_gpu}
    if workers:
        options.update(prefetch_factor=4, persistent_workers=True, multiprocessing_context=worker_context())
    return options


def train_loader(dataset: SeededImages, sampler: StepSampler, start: int, end: int, workers: int, on_gpu: bool):
    return DataLoader(dataset, batch_sampler=StepBatches(sampler, start, end), **loader_options(workers, on_gpu))


def val_loader(folder: datasets.ImageFolder, rank: int, world: int, batch: int, workers: int, on_gpu: bool):
    """Every image exactly once over all ranks (rank r reads r, r+world, ...), so accuracy is exact."""
    indices = list(range(rank, len(folder), world))
    subset = torch.utils.data.Subset(folder, indices)
    options = loader_options(workers, on_gpu)
    return DataLoader(subset, batch_size=batch, shuffle=False, **options)


def synthetic_batch(
    micro_batch: int, size: int, num_classes: int, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One random batch created on the device and reused every step: no host work, no transfer."""
    generator = torch.Generator(device=device).manual_seed(seed)
    images = torch.randn(micro_batch, 3, size, size, device=device, generator=generator)
    labels = torch.randint(0, num_classes, (micro_batch,), device=device, generator=generator)
    return images, labels
