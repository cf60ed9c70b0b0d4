"""What a checkpoint holds of the training (model, optimizer, schedule, RNG), and Accelerate's way of writing it:
RunContext (training/common/run.py) saves and loads one per checkpoint folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

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
