"""The launcher's rules for held-out data and evaluation (issue 52): what may be combined, checked before anything
is written; the records themselves are checked where the run folder is prepared (trainkit/run/prepare.py)."""

from __future__ import annotations

from pathlib import Path

from training.spec import Job
from trainkit.errors import SpecError
from trainkit.job.models import HUB_ID


def validate_evaluation(job: Job) -> None:
    """A language model's held-out data comes one way, and the evaluation flags need some."""
    held_out = job.evaluation
    if held_out.data and held_out.fraction:
        raise SpecError(
            f"--eval-data {held_out.data} and --eval-fraction {held_out.fraction}: held-out data comes one way; "
            "give one of them"
        )
    if not (held_out.data or held_out.fraction):
        for flag, value in (("--eval-interval", held_out.interval), ("--eval-batches", held_out.batches)):
            if value:
                raise SpecError(
                    f"{flag} {value}: there is no held-out data to evaluate on; add --eval-fraction F (records held "
                    "out of --dataset) or --eval-data PATH"
                )
    if held_out.data and held_out.data == job.data.dataset:
        raise SpecError(
            f"--eval-data {held_out.data} is the training data: its records would be trained on; give other records, "
            "or --eval-fraction F to hold some out"
        )


def validate_eval_data_here(job: Job) -> None:
    """A local --eval-data exists (else it must be a hub dataset id), as --dataset is checked."""
    data = job.evaluation.data
    if data is None or data.startswith("s3://") or Path(data).expanduser().exists():
        return
    if HUB_ID.fullmatch(data) is None:
        raise SpecError(
            f"--eval-data {data}: no such file or folder, and not a Hugging Face dataset id (owner/name); give a "
            ".jsonl file, a dataset folder or an owner/name id"
        )
