"""The launcher's view of the model registry, which lives in `training/registry.py` (torch-free, so the launcher
plans and checks a job without PyTorch, and the workers read the same table), and of any other Hugging Face causal
LM `--model` names: a hub id, a local model folder or a `config.json` file."""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

from training.registry import (
    DECODER_BUILDER,
    REGISTRY,
    BertArch,
    DecoderArch,
    ModelEntry,
    Recipe,
    VisionArch,
    decoder_recipe,
)
from trainkit.errors import SpecError

__all__ = ["HUB_ID", "REGISTRY", "BertArch", "DecoderArch", "ModelEntry", "Recipe", "VisionArch", "get_model"]

# A Hugging Face hub id: owner/name (canonical one-word names moved under owners in 2024).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
CONFIG_FILE = "config.json"


def validate_weights_here(job) -> None:
    """--weights of a run on this machine: a local model folder or a hub id (a dry run says so too; the run's own
    check before it starts is trainkit/run/prepare.py's)."""
    weights = job.model.weights or ""
    if job.model.init != "pretrained":
        return
    if weights.startswith("s3://"):
        raise SpecError(
            f"--weights {weights}: a run on this machine reads no S3 (a SageMaker job mounts it as a channel); copy "
            "the model folder here (`aws s3 cp --recursive`) and give the local path, or a Hugging Face hub id"
        )
    if not downloads_weights(job) and not Path(weights).expanduser().is_dir():
        raise SpecError(
            f"--weights {weights}: no model folder there; give the folder of a Hugging Face model (its config.json "
            "and weights) or a hub id (owner/name)"
        )


def downloads_weights(job) -> bool:
    """Whether a cluster job's workers download --weights from the hub (and so need the Hugging Face token): a hub id
    (owner/name), not an s3:// prefix (SageMaker's weights channel) nor a folder's absolute or ./ path (on the FSx
    volume). A relative owner/name is taken for a hub id: give a folder on the volume by its absolute path."""
    weights = job.model.weights or ""
    if job.model.init != "pretrained" or weights.startswith(("s3://", "/", ".", "~")):
        return False
    return HUB_ID.fullmatch(weights) is not None


def get_model(name: str) -> ModelEntry:
    """The model `--model` names: a registry entry; else the causal LM of a local model folder (its config.json), of
    a config.json file, or of a hub id (its config fetched, HF_TOKEN from the environment). Anything else, and a
    model trainkit cannot size, is refused before anything starts."""
    if name in REGISTRY:
        return REGISTRY[name]
    path = Path(name).expanduser()
    if path.is_dir() or path.is_file():
        config = path / CONFIG_FILE if path.is_dir() else path
        if not config.is_file():
            raise SpecError(f"--model {name}: the folder holds no {CONFIG_FILE}; give a Hugging Face model folder")
        return _from_file(name, str(config.resolve()), config.stat().st_mtime_ns)
    if HUB_ID.fullmatch(name) and not name.startswith((".", "/", "~")):
        return _from_hub(name)
    raise SpecError(
        f"--model {name!r} is not a known model; choose one of: {', '.join(REGISTRY)}; or give a Hugging Face causal "
        "LM: a hub id (owner/name), a local model folder or its config.json (no such folder or file exists here)"
    )


@functools.cache
def _from_file(name: str, config_path: str, mtime_ns: int) -> ModelEntry:
    """Read once per file version: the launcher asks for the model many times while it builds and checks a job."""
    path = Path(config_path)
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise SpecError(f"--model {name}: {path} is not a readable JSON config ({error})") from None
    if not isinstance(config, dict):
        raise SpecError(f"--model {name}: {path} holds no JSON object; give a Hugging Face config.json")
    # A folder's weights are what --init pretrained loads; a config.json given alone brings none.
    weights = str(path.parent) if Path(name).expanduser().is_dir() else None
    label = path.parent.name if path.name == CONFIG_FILE else path.stem
    return _entry(name, config, hub_id=weights, label=label)


@functools.cache
def _from_hub(name: str) -> ModelEntry:
    """A hub model's config, fetched once per launch (transformers is imported here only, never to plan a registry
    model)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(name, token=os.environ.get("HF_TOKEN")).to_dict()
    except (OSError, ValueError) as error:
        raise SpecError(
            f"--model {name}: no such registry model or local folder, and the hub gave no config for it ({error}); "
            "check the id (a gated model also needs HF_TOKEN or --hf-token-file), or give a local model folder"
        ) from None
    return _entry(name, config, hub_id=name, label=name.rsplit("/", 1)[-1])


def _entry(name: str, config: dict, hub_id: str | None, label: str) -> ModelEntry:
    try:
        arch = DecoderArch.from_config(config)
    except ValueError as error:
        raise SpecError(f"--model {name}: {error}") from None
    return ModelEntry(
        name=name,
        family="decoder",
        arch=arch,
        recipe=decoder_recipe(arch),
        builder=DECODER_BUILDER,
        hub_id=hub_id,
        label=_safe(label),
    )


def _safe(label: str) -> str:
    """A run id's first part: letters, digits, '.', '_' and '-', starting with a letter or digit, short."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", label).lstrip("._-")[:40]
    return cleaned or "model"
