"""What a checkpoint holds of the training (model, optimizer, schedule, RNG), and Accelerate's way of writing it:
RunContext (training/common/run.py) saves and loads one per checkpoint folder."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import torch
from accelerate import Accelerator

from .weights_only import NUMPY_RNG_STATE


class TrainingState(Protocol):
    """What a checkpoint holds of the training (model, optimizer, schedule, RNG), written into and read from one
    checkpoint folder by every rank. RunContext loads it weights-only (training/common/weights_only.py)."""

    @property
    def safe_globals(self) -> tuple:
        """The classes and functions beyond torch's weights-only set that its files name, each one's reason beside."""
        ...

    def save(self, directory: Path) -> None: ...

    def load(self, directory: Path) -> None: ...


@dataclass(frozen=True)
class AcceleratorCheckpoint:
    """Accelerate's own: `save_state` / `load_state` over what the Accelerator prepared and registered. Its files:
    model.safetensors, or DCP's folders under FSDP; optimizer.bin and custom_checkpoint_<i>.pkl (the schedule),
    tensors and plain data; random_states_<rank>.pkl, which holds numpy's RNG state (NUMPY_RNG_STATE)."""

    accelerator: Accelerator
    safe_globals = NUMPY_RNG_STATE

    def save(self, directory: Path) -> None:
        self.accelerator.save_state(str(directory))

    def load(self, directory: Path) -> None:
        self.accelerator.load_state(str(directory))


ADAPTERS = "adapters"
"""The DCP folder of an AdapterCheckpoint: the adapters' weights and their optimizer state."""


@contextlib.contextmanager
def _without_weights(accelerator: Accelerator) -> Iterator[None]:
    """Accelerate's save_state / load_state over everything but the prepared model and optimizer: both loop over the
    Accelerator's `_models` and `_optimizers` (accelerate 1.15.0 accelerator.py `save_state`, `load_state`), so with
    those lists emptied for the call they write and read the schedule, RNG states, samplers and registered objects
    only. Pinned accelerate (pyproject.toml) keeps that true; tests/e2e/test_lora.py fails if it changes."""
    models, optimizers = accelerator._models, accelerator._optimizers
    accelerator._models, accelerator._optimizers = [], []
    try:
        yield
    finally:
        accelerator._models, accelerator._optimizers = models, optimizers


@dataclass(frozen=True)
class AdapterCheckpoint:
    """A LoRA run's (issue 53): the adapters and their optimizer state only, sharded as FSDP2 holds them, written by
    DCP into adapters/ (torch's `get_state_dict` with `ignore_frozen_params`: the frozen base weights are the
    source's, loaded again at every start, so no checkpoint copies them); the rest as Accelerate writes it. DCP reads
    a checkpoint back at any world size."""

    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    safe_globals = NUMPY_RNG_STATE

    def _state(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(ignore_frozen_params=True)
        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # Accelerate's wrapper holds torch's
        model_state, optimizer_state = get_state_dict(self.model, optimizer, options=options)
        return {"model": model_state, "optimizer": optimizer_state}, optimizer, options

    def save(self, directory: Path) -> None:
        import torch.distributed.checkpoint as dcp

        state, _, _ = self._state()
        dcp.save(state, checkpoint_id=str(directory / ADAPTERS))
        with _without_weights(self.accelerator):
            self.accelerator.save_state(str(directory))

    def load(self, directory: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state, optimizer, options = self._state()
        dcp.load(state, checkpoint_id=str(directory / ADAPTERS))
        set_state_dict(
            self.model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=replace(options, strict=False),  # the frozen weights are not in it, by design
        )
        with _without_weights(self.accelerator):
            self.accelerator.load_state(str(directory))
