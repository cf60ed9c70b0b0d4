"""The launcher's rules for LoRA (issue 53), checked before anything is written: the adapters' size and scale,
the base weights they adapt, and the layers named for them. Torch-free, as the launcher is: a decoder layer's linear
layers come from the model's shape (training/common/flops.py `linear_shapes`), which tests/unit/test_plan.py holds
to the layers transformers builds for every decoder type the registry takes."""

from __future__ import annotations

from training.registry import ModelEntry
from training.spec import Job
from trainkit.errors import SpecError


def validate_lora(job: Job, entry: ModelEntry) -> None:
    lora = job.lora
    if not lora.enabled:
        for flag, value in (
            ("--lora-alpha", lora.alpha),
            ("--lora-dropout", lora.dropout),
            ("--lora-targets", lora.targets),
            ("--export", lora.export),
        ):
            if value is not None:
                what = "exports a LoRA run" if flag == "--export" else "sets LoRA's adapters"
                raise SpecError(f"{flag} {value} {what} and the run trains no adapters; give --lora-rank R too")
        return
    if job.model.init != "pretrained":
        raise SpecError(
            f"--lora-rank {lora.rank} on --init random: adapters trained on random base weights teach nothing (the "
            "base stays random); give --init pretrained (--weights takes a hub id or a local model folder)"
        )
    check_shape(job, entry)


def check_shape(job: Job, entry: ModelEntry) -> None:
    """A rank within the hidden size, targets the model's layers have (`invoke train` and `invoke plan` alike)."""
    lora = job.lora
    if not lora.enabled:
        if lora.targets is not None:
            raise SpecError(
                f"--lora-targets {lora.targets} sets LoRA's adapters and there are none; give --lora-rank R"
            )
        return
    hidden = entry.arch.hidden_size
    if lora.rank > hidden:
        raise SpecError(
            f"--lora-rank {lora.rank} exceeds {entry.name}'s hidden size {hidden}: an adapter of that rank is no "
            f"low-rank update; use --lora-rank 1..{hidden} (8-64 is usual)"
        )
    names = lora.target_names
    if lora.targets is not None and not names:
        raise SpecError(f"--lora-targets {lora.targets!r} names no layer; give names such as q_proj,v_proj")
    have = list(entry.arch.shape().linear_shapes())  # the model's own names: tests/unit/test_plan.py holds them
    missing = [name for name in names or () if name not in have]
    if missing:
        raise SpecError(
            f"--lora-targets: {entry.name} has no linear layer named {', '.join(missing)}; its decoder layer's "
            f"linear layers are {', '.join(have)}"
        )
