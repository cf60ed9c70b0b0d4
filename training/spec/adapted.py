"""Low-rank adapters (issue 53): a decoder fine-tune that trains LoRA adapters on frozen base weights instead of
every weight (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"), applied with PEFT."""

from __future__ import annotations

from dataclasses import dataclass

from training.spec.options import option


@dataclass
class LoraOptions:
    """LoRA: which linear layers of the decoder get adapters, and their size. Without --lora-rank the run is a full
    fine-tune, as before."""

    rank: int | None = option(
        None,
        "Train LoRA adapters of this rank on frozen base weights instead of every weight (default: none, a full "
        "fine-tune). Needs --init pretrained: adapters on random weights teach nothing.",
        flag="lora-rank",
        minimum=1,
        family="decoder",
    )
    alpha: float | None = option(
        None,
        "LoRA's scale numerator: an adapter's update is scaled by alpha / rank (default: 2 x --lora-rank, as "
        "torchtune's Llama 2 LoRA configs pair rank 8 with alpha 16).",
        flag="lora-alpha",
        above=0,
        family="decoder",
    )
    dropout: float | None = option(
        None,
        "Dropout on the adapters' input (default 0).",
        flag="lora-dropout",
        minimum=0,
        below=1,
        family="decoder",
    )
    targets: str | None = option(
        None,
        "Comma-separated names of the linear layers that get adapters (q_proj,v_proj); default: every linear layer "
        "of a decoder layer's attention and MLP, as the model names them.",
        flag="lora-targets",
        family="decoder",
    )

    export: str | None = option(
        None,
        "What a LoRA run exports: `adapter`, PEFT's adapter folder (runs/<id>/model), or `merged`, that and a full "
        "model with the adapters merged in (runs/<id>/model-merged); default: adapter.",
        flag="export",
        choices=("adapter", "merged"),
        trains=False,
        family="decoder",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.rank)

    @property
    def scale_alpha(self) -> float:
        """The alpha in use: the given one, else twice the rank."""
        return float(self.alpha) if self.alpha is not None else 2.0 * float(self.rank or 0)

    @property
    def target_names(self) -> tuple[str, ...] | None:
        """The given target names, None for the default (every linear layer of a decoder layer)."""
        if not self.targets:
            return None
        return tuple(name.strip() for name in self.targets.split(",") if name.strip())
