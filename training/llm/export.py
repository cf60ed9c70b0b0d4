"""The exported model folder (`runs/<id>/model/`), ready to serve: what `save_pretrained` alone would get wrong.

- The config says `use_cache: true`. Training builds the model with the cache off (no use for it in a training
  forward); saved so, `generate()` on the export would recompute the whole sequence at every new token.
- The generation config is the source's own when the run started from pretrained weights that have one (its stop
  tokens, e.g. `[4, 2]`, and its recommended sampling), else one derived from the config with the tokenizer's
  <bos>, <eos> and <pad>.
- The weights are saved in the dtype the run trained in: a pretrained folder's own dtype (a bf16 source stays
  bf16: half the size, and served in bf16 by vLLM's `--dtype auto`); from a config, bf16 when the run computed in
  bf16 (`--precision bf16`, the GPU default), else fp32.
- README.md, a model card with the training facts: the source, the data, the steps, the final loss, trainkit's
  version and commit where known.
"""

from __future__ import annotations

import os
import subprocess
from importlib import metadata
from pathlib import Path

import torch
from transformers import GenerationConfig, PretrainedConfig

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def config_dtype(config: PretrainedConfig) -> torch.dtype | None:
    """The dtype a pretrained source's config names (transformers writes `dtype`, older `torch_dtype`)."""
    named = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return named if isinstance(named, torch.dtype) else DTYPES.get(str(named))


def source_generation(weights: str | None) -> GenerationConfig | None:
    """A pretrained source's generation_config.json, None when it has none."""
    if weights is None:
        return None
    try:
        return GenerationConfig.from_pretrained(weights, token=os.environ.get("HF_TOKEN"))
    except OSError:
        return None


def export_dtype(precision: str, source: torch.dtype | None) -> torch.dtype:
    """The source's dtype; from a config, the one the run computed in (`precision` resolved: bf16 or fp32)."""
    if source is not None:
        return source
    return torch.bfloat16 if precision == "bf16" else torch.float32


def generation_config(source: GenerationConfig | None, config: PretrainedConfig, tokenizer) -> GenerationConfig:
    """The source's, else one from the config with the tokenizer's special tokens; the cache on either way."""
    made = source or GenerationConfig.from_model_config(config)
    if source is None:
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(tokenizer, name, None)
            if value is not None:
                setattr(made, name, value)
    made.use_cache = True
    return made


def trainkit_version() -> str:
    """trainkit's version, and the commit when it runs from a git checkout (a local run; an image has no .git)."""
    version = metadata.version("trainkit")
    here = Path(__file__).resolve().parent
    try:  # an image has neither the checkout nor git itself
        found = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    except OSError:
        return version
    return f"{version} (commit {found.stdout.strip()})" if found.returncode == 0 else version


def model_card(facts: dict) -> str:
    """README.md of the export: what it is and how it was trained, one fact a line."""
    lines = [f"# {facts['run_id']}", "", "Trained with trainkit.", ""]
    lines += [f"- **{name}**: {value}" for name, value in facts.items() if value not in (None, "")]
    return "\n".join(lines) + "\n"


def save(model, folder: Path, dtype: torch.dtype, generation: GenerationConfig, card: dict) -> None:
    """Write `model` (a plain, consolidated copy) into `folder` as the module docstring says."""
    model.config.use_cache = True
    model.generation_config = generation
    model.to(dtype).save_pretrained(folder, safe_serialization=True)
    (folder / "README.md").write_text(model_card(card))
