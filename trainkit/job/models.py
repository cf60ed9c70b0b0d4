"""The launcher's view of the model registry, which lives in `training/registry.py` (torch-free, so the launcher
plans and checks a job without PyTorch, and the workers read the same table)."""

from __future__ import annotations

from training.registry import REGISTRY, BertArch, LlamaArch, ModelEntry, Recipe, VisionArch, model_entry
from trainkit.errors import SpecError

__all__ = ["REGISTRY", "BertArch", "LlamaArch", "ModelEntry", "Recipe", "VisionArch", "get_model"]


def get_model(name: str) -> ModelEntry:
    """The registry entry of `--model`; a name it lacks is refused before anything starts."""
    try:
        return model_entry(name)
    except ValueError as error:
        raise SpecError(str(error)) from None
