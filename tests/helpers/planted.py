"""A pickle that runs code when loaded: what another job could put in a checkpoint on a shared disk."""

from __future__ import annotations

import os
from pathlib import Path


class Planted:
    """Unpickled, it makes the folder `marker` (so a test sees whether the load ran it)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


REFUSED = "would import posix.mkdir when unpickled (checkpoints load tensors and plain data only)"
"""How training/common/weights_only.py names what such a file would do."""


def plant_and_load(state, folder: Path, tmp_path: Path, name: str) -> Path:
    """A copy of the checkpoint `folder` with a Planted pickle as its file `name`, loaded weights-only as a resume
    loads it (training/common/weights_only.py): asserts the load refuses that file by name and its code never ran;
    returns the planted file."""
    import shutil

    import pytest
    import torch

    from training.common.weights_only import RefusedCheckpoint, load_weights_only

    planted = tmp_path / "step-00000001"
    shutil.copytree(folder, planted)
    torch.save({"state": Planted(tmp_path / "ran")}, planted / name)
    with pytest.raises(RefusedCheckpoint) as refused:
        load_weights_only(planted, state.load, state.safe_globals)
    assert str(refused.value) == f"{name} {REFUSED}"
    assert not (tmp_path / "ran").exists()
    return planted / name
