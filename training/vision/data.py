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

Each loader worker leaves its trainer's process group at start: a stop is the trainer's to handle (at a step
boundary, with a checkpoint), and torchrun ends a worker by signalling its whole group (torch.distributed.elastic
SubprocessHandler.close: os.killpg), as does a terminal's Ctrl-C. A loader worker killed by that signal failed the
trainer's next batch ("DataLoader worker ... is killed by signal: Terminated", seen on the SageMaker stand-in)
before the step where it checkpoints. Outside the group, a worker still ends with its trainer: the loader shuts it
down on a normal exit, and the kernel kills it when the trainer dies (PR_SET_PDEATHSIG, as torchrun's workers do).
Ignoring the signal instead would not do: Python's exit then terminates and joins the workers, and waits forever.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torchvision import datasets, transforms

from training.common.failure import DataError
from training.common.lifecycle import die_with_parent
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

    def __getitem__(self, index: int):
        """An image that does not decode is bad data, named, and no restart can mend it (DataError). Decoding
        errors carry no errno (PIL's UnidentifiedImageError, a truncated file); an I/O error does and stays
        what it is (a volume's fault may pass)."""
        try:
            return super().__getitem__(index)
        except (OSError, SyntaxError, ValueError) as error:
            if isinstance(error, OSError) and error.errno is not None:
                raise
            path = self.samples[index][0]
            why = f"{type(error).__name__}: {error}"
            raise DataError(f"image {path} does not decode ({why}); replace or remove it") from error


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


def leave_trainer_group(_worker_id: int) -> None:
    """Each loader worker's start: a process group of its own, and death with its trainer (the module's docstring
    says why)."""
    os.setpgid(0, 0)
    die_with_parent()


def worker_context() -> multiprocessing.context.BaseContext:
    return multiprocessing.get_context("spawn")  # not fork, not forkserver: see the module's docstring


@dataclass(frozen=True)
class LoaderSettings:
    """How the loaders run (the job's --loader-workers, --pin-memory, --persistent-workers, --prefetch-factor):
    when and where batches are made, never which pixels; a run's losses are the same under any of them."""

    workers: int
    pin_memory: bool = False
    persistent_workers: bool = True
    prefetch_factor: int = 4

    @classmethod
    def of(cls, data, on_gpu: bool) -> LoaderSettings:
        """The job's data options, their defaults filled in: pinned memory on GPUs, persistent workers, 4 ahead."""
        return cls(
            workers=data.loader_workers,
            pin_memory=on_gpu if data.pin_memory is None else data.pin_memory,
            persistent_workers=True if data.persistent_workers is None else data.persistent_workers,
            prefetch_factor=4 if data.prefetch_factor is None else data.prefetch_factor,
        )

    def options(self) -> dict:
        options: dict = {"num_workers": self.workers, "pin_memory": self.pin_memory}
        if self.workers:
            options.update(
                prefetch_factor=self.prefetch_factor,
                persistent_workers=self.persistent_workers,
                multiprocessing_context=worker_context(),
                worker_init_fn=leave_trainer_group,
            )
        return options


def taken(loader: DataLoader) -> dict:
    """What a loader was built with, read back from it (for the run's summary)."""
    workers = loader.num_workers
    return {
        "loader_workers": workers,
        "pin_memory": loader.pin_memory,
        "persistent_workers": loader.persistent_workers if workers else None,
        "prefetch_factor": loader.prefetch_factor if workers else None,
    }


def train_loader(dataset: SeededImages, sampler: StepSampler, start: int, end: int, settings: LoaderSettings):
    return DataLoader(dataset, batch_sampler=StepBatches(sampler, start, end), **settings.options())


def val_loader(folder: datasets.ImageFolder, rank: int, world: int, batch: int, settings: LoaderSettings):
    """Every image exactly once over all ranks (rank r reads r, r+world, ...), so accuracy is exact."""
    indices = list(range(rank, len(folder), world))
    subset = torch.utils.data.Subset(folder, indices)
    return DataLoader(subset, batch_size=batch, shuffle=False, **settings.options())


def synthetic_batch(
    micro_batch: int, size: int, num_classes: int, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One random batch created on the device and reused every step: no host work, no transfer."""
    generator = torch.Generator(device=device).manual_seed(seed)
    images = torch.randn(micro_batch, 3, size, size, device=device, generator=generator)
    labels = torch.randint(0, num_classes, (micro_batch,), device=device, generator=generator)
    return images, labels
