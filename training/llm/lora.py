"""LoRA on a decoder (issue 53): adapters injected with PEFT into the model transformers built, in place, before
FSDP2 shards it; what a checkpoint keeps of them; and the two exports, PEFT's adapter folder and a merged model.

PEFT (Hugging Face's own LoRA, pinned in pyproject.toml) injects `LoraLayer`s in place of the target linear layers
(`inject_adapter_in_model`): the model stays the class transformers built, so FSDP2's wrapping by decoder layer, the
compile and checkpointing of layers and the FLOP count see the same modules as a full fine-tune. An injected layer
keeps the base weight as `<name>.base_layer.weight` and adds `<name>.lora_A.default.weight` (rank x in, PEFT's
Kaiming-uniform init) and `<name>.lora_B.default.weight` (out x rank, zeros): the adapted model starts equal to the
base. Its output is base(x) + (alpha / rank) * B(A(dropout(x))) (peft/tuners/lora/layer.py `Linear.forward`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from training.spec import Job

ADAPTER = "default"
"""PEFT's name of the one adapter (the `default` in its parameter names; dropped from a saved adapter's keys)."""
SAVED_PREFIX = "base_model.model."
"""What `PeftModel.save_pretrained` puts before each key of adapter_model.safetensors: the PeftModel's own path to the
wrapped model (peft/peft_model.py; `PeftModel.from_pretrained` maps it back)."""


def default_targets(model: torch.nn.Module, layer_class: str) -> list[str]:
    """Every linear layer of a decoder layer (its attention's and its MLP's), by the names the model gives them."""
    layer = next(m for m in model.modules() if type(m).__name__ == layer_class)
    found: list[str] = []
    for name, module in layer.named_modules():
        last = name.rsplit(".", 1)[-1]
        if isinstance(module, torch.nn.Linear) and last not in found:
            found.append(last)
    return found


def lora_config(job: Job, targets: list[str], base: str | None):
    from peft import LoraConfig

    if base is not None and Path(base).expanduser().is_dir():  # a local folder: loadable from anywhere here
        base = str(Path(base).expanduser().resolve())

    lora = job.lora
    return LoraConfig(
        r=int(lora.rank),
        lora_alpha=lora.scale_alpha,
        lora_dropout=float(lora.dropout or 0.0),
        target_modules=list(targets),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base,
    )


def apply(model: torch.nn.Module, job: Job, layer_class: str) -> list[str]:
    """Inject the adapters in place and freeze everything else; the target names used."""
    from peft import inject_adapter_in_model

    targets = list(job.lora.target_names or default_targets(model, layer_class))
    inject_adapter_in_model(lora_config(job, targets, job.model.weights), model, adapter_name=ADAPTER)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(is_adapter(name))
    return targets


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, all) parameter counts of the unsharded model."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


def held(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """What the prepared model and its optimizer hold, for the run's summary: the dtypes the frozen and the trained
    parameters are stored in, how many frozen ones ask for a gradient (none: FSDP2 and DDP reduce only the gradients
    there are), and how many elements the optimizer steps (global counts: FSDP2's DTensors give their whole size)."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    trained = [p for p in model.parameters() if p.requires_grad]
    stepped = [p for group in getattr(optimizer, "optimizer", optimizer).param_groups for p in group["params"]]

    def dtypes(parameters: list[torch.Tensor]) -> list[str]:
        return sorted({str(p.dtype).removeprefix("torch.") for p in parameters})

    return {
        "frozen_dtypes": dtypes(frozen),
        "trained_dtypes": dtypes(trained),
        "trained_params": sum(p.numel() for p in trained),
        "optimizer_params": sum(p.numel() for p in stepped),
        "frozen_in_optimizer": sum(not p.requires_grad for p in stepped),
    }


def adapter_state(full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors of a consolidated state dict, named as PEFT saves them: SAVED_PREFIX before, the
    adapter's name out (`...q_proj.lora_A.weight`)."""
    return {
        SAVED_PREFIX + name.replace(f".{ADAPTER}.", "."): tensor.contiguous()
        for name, tensor in full.items()
        if is_adapter(name)
    }


def merge_into(base: torch.nn.Module, full: dict[str, torch.Tensor], job: Job) -> torch.nn.Module:
    """`base` (the source's weights as loaded, in fp32, not the run's bf16 copy of them) with each adapter of `full`
    merged into its weight: W + (alpha / rank) * B @ A in fp32 (PEFT's `merge` adds the same delta:
    peft/tuners/lora/layer.py `get_delta_weight`), so the export is cast to its dtype once."""
    scale = job.lora.scale_alpha / int(job.lora.rank)
    weights = dict(base.named_parameters())
    with torch.no_grad():
        for name in full:
            if name.endswith(f".lora_A.{ADAPTER}.weight"):
                layer = name.removesuffix(f".lora_A.{ADAPTER}.weight")
                a, b = full[name].float(), full[f"{layer}.lora_B.{ADAPTER}.weight"].float()
                weights[f"{layer}.weight"].add_(scale * (b @ a))
    return base


def save_adapter(full: dict[str, torch.Tensor], folder: Path, job: Job, targets: list[str], dtype: torch.dtype) -> None:
    """PEFT's adapter folder: adapter_config.json and adapter_model.safetensors (what `PeftModel.from_pretrained`
    loads onto the base model named in the config)."""
    from safetensors.torch import save_file

    config = lora_config(job, targets, job.model.weights)
    config.save_pretrained(str(folder))
    tensors = {name: tensor.to(dtype) for name, tensor in adapter_state(full).items()}
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})


def is_adapter_folder(folder: Path) -> bool:
    return (folder / "adapter_config.json").is_file()


def adapter_base(folder: Path) -> str | None:
    return json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
