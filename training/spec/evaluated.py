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
        "Evaluate every N optimizer steps and after the last (default: language models at every checkpoint when "
        "they have held-out data, vision at every epoch's end; 0 turns evaluation off).",
        flag="eval-interval",
        minimum=0,
        trains=False,
    )
    batches: int | None = option(
        None,
        "Evaluate on at most this many batches (a micro batch on every rank each); default: all held-out data.",
        flag="eval-batches",
        minimum=1,
        trains=False,
    )
    keep_best: bool | None = option(
        None,
        "Keep the checkpoint of the best evaluation (the family's figure: eval loss, vision's top-1) apart from the "
        "rolling --keep-checkpoints, as checkpoints/best names it; default: true when the run evaluates.",
        flag="keep-best",
        trains=False,
    )
    export_from: str | None = option(
        None,
        "Decoders: export the model from the `best` checkpoint or the `last` one; default: best when the best is "
        "kept (--keep-best), else last.",
        flag="export-from",
        choices=("best", "last"),
        trains=False,
        family="decoder",
    )
    early_stop_patience: int | None = option(
        None,
        "Stop after this many evaluations in a row without an improvement of more than --early-stop-delta: a normal "
        "end (a final checkpoint, the export, exit 0) that no restart or retry trains on from.",
        flag="early-stop-patience",
        minimum=1,
    )
    early_stop_delta: float | None = option(
        None,
        "How much an evaluation must improve on the best so far to count for --early-stop-patience (default 0).",
        flag="early-stop-delta",
        minimum=0,
    )
