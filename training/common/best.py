"""The best evaluation so far, and how long since one counted (issue 52): what --keep-best keeps and what
--early-stop-patience counts. It travels in every checkpoint's trainer state, so a resumed run judges from where
the checkpoint left it, on every rank and host alike."""

from __future__ import annotations

from dataclasses import asdict, dataclass

BEST_POINTER = "best"
"""In the checkpoints folder: the name of the best evaluation's checkpoint (beside `latest`)."""


@dataclass
class BestSoFar:
    metric: str
    lower_is_better: bool
    delta: float = 0.0
    """How much an evaluation must improve on the best to reset the patience count (Hugging Face's
    EarlyStoppingCallback `early_stopping_threshold`); the best itself follows every improvement."""
    step: int | None = None
    value: float | None = None
    stale: int = 0
    """Evaluations in a row since one improved on the best by more than `delta`."""

    def offer(self, step: int, figures: dict) -> bool:
        """Judge an evaluation (its figures, the family's `metric` among them); whether it is the best so far."""
        value = figures[self.metric]
        if self.value is None:
            self.step, self.value, self.stale = step, value, 0
            return True
        gain = (self.value - value) if self.lower_is_better else (value - self.value)
        self.stale = 0 if gain > self.delta else self.stale + 1
        if gain > 0:
            self.step, self.value = step, value
            return True
        return False

    def state(self) -> dict:
        return {"step": self.step, "value": self.value, "stale": self.stale}

    def restore(self, saved: dict | None) -> None:
        """From a checkpoint's trainer state (none: a checkpoint written before evaluation, or without it)."""
        if saved:
            self.step, self.value, self.stale = saved["step"], saved["value"], saved["stale"]

    def said(self) -> dict:
        return asdict(self)
