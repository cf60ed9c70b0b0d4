"""How a job is evaluated on held-out data (issue 52): where that data comes from and how often it is read."""

from __future__ import annotations

from dataclasses import dataclass

from training.families import text_families
from training.spec.options import option


@dataclass
class EvaluationOptions:
    """Held-out data and how often the model is evaluated on it. Language models hold out `--eval-data` or a
    fraction of their records; vision evaluates on its tree's val/ folder."""

    data: str | None = option(
        None,
        "Held-out records to evaluate on, in any form --dataset takes (a file, a folder of them, a saved or hub "
        "dataset: --eval-split) and in the training records' format; or use --eval-fraction.",
        flag="eval-data",
        family=text_families,
    )
    split: str | None = option(
        None,
        "Split of a Hugging Face --eval-data dataset (default: validation).",
        flag="eval-split",
        family=text_families,
    )
    fraction: float | None = option(
        None,
        "Hold out this fraction of the training records (whole records, chosen by --seed before packing, never "
        "trained on: the same ones on every rank, after every restart and at any node count) to evaluate on.",
        flag="eval-fraction",
        above=0,
        below=1,
        family=text_families,
    )
    interval: int | None = option(
        None,
        "Evaluate every N optimizer steps and after the last (default: at every checkpoint when there is held-out "
        "data; 0 turns evaluation off).",
        flag="eval-interval",
        minimum=0,
        trains=False,
        family=text_families,
    )
    batches: int | None = option(
        None,
        "Evaluate on at most this many batches (a micro batch on every rank each); default: all held-out data.",
        flag="eval-batches",
        minimum=1,
        trains=False,
        family=text_families,
    )
