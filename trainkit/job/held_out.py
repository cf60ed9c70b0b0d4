"""The launcher's rules for held-out data and evaluation (issue 52): what may be combined, checked before anything
is written; the records themselves are checked where the run folder is prepared (trainkit/run/prepare.py)."""

from __future__ import annotations

from pathlib import Path

from training.families import Family
from training.spec import Job
from training.text.holdout import evaluates
from trainkit.errors import SpecError
from trainkit.job.models import HUB_ID


def validate_evaluation(job: Job, text: bool) -> None:
    """A language model's held-out data comes one way, and the evaluation flags need some (a vision job's is its
    val/ split, which --synthetic lacks)."""
    held_out = job.evaluation
    if not text:
        for flag, value in (("--eval-interval", held_out.interval), ("--eval-batches", held_out.batches)):
            if value and job.data.synthetic:
                raise SpecError(
                    f"{flag} {value}: --synthetic feeds random tensors and has no val/ split to evaluate on; drop "
                    f"{flag} (or --synthetic)"
                )
        return
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
    if held_out.split and not held_out.data:
        raise SpecError(
            f"--eval-split {held_out.split} names a split of --eval-data; give --eval-data too (or drop it)"
        )
    if held_out.data and _same_data(held_out.data, held_out.split or "validation", job):
        raise SpecError(
            f"--eval-data {held_out.data} is the training data: its records would be trained on; give other records, "
            "or --eval-fraction F to hold some out"
        )


def _same_data(eval_data: str, eval_split: str, job: Job) -> bool:
    """The same records as --dataset: the same local file or folder, or the same hub dataset and split."""
    here, trained = Path(eval_data).expanduser(), Path(job.data.dataset).expanduser()
    if here.exists() or trained.exists():
        return here.exists() and trained.exists() and here.resolve() == trained.resolve()
    return eval_data == job.data.dataset and eval_split == job.data.dataset_split


def validate_eval_data_here(job: Job) -> None:
    """A local run's --eval-data exists (else it must be a hub dataset id), as --dataset is checked."""
    data = job.evaluation.data
    if data is None or Path(data).expanduser().exists():
        return
    if data.startswith("s3://"):
        raise SpecError(
            f"--eval-data {data}: a run on this machine reads no S3 (a SageMaker job mounts it as a channel); copy it "
            "here (`aws s3 cp --recursive`) and give the local path"
        )
    if HUB_ID.fullmatch(data) is None:
        raise SpecError(
            f"--eval-data {data}: no such file or folder, and not a Hugging Face dataset id (owner/name); give a "
            ".jsonl file, a dataset folder or an owner/name id"
        )


def derive_evaluation(job: Job, family: Family) -> None:
    """What evaluation decides when the flags leave it open: the best checkpoint is kept when the run evaluates,
    and a family that exports exports from it then (else from the last)."""
    held_out = job.evaluation
    if held_out.keep_best is None:
        held_out.keep_best = evaluates(job)
    if family.exports and held_out.export_from is None:
        held_out.export_from = "best" if held_out.keep_best and not hosts_hold_parts(job) else "last"


def hosts_hold_parts(job: Job) -> bool:
    """Whether each host keeps only its own part of a checkpoint while the job runs (a SageMaker job of several
    instances: training/common/checkpoint.py, per-host publishing), so no host can load an older one whole."""
    return job.placement.target == "sagemaker" and job.parallelism.nodes > 1


def validate_keeping(job: Job) -> None:
    """The best checkpoint and early stopping need evaluations to judge by."""
    held_out = job.evaluation
    if evaluates(job):
        if held_out.export_from == "best" and hosts_hold_parts(job):
            raise SpecError(
                f"--export-from best on {job.parallelism.nodes} SageMaker instances: each keeps only its part of a "
                "checkpoint, so the best one cannot be loaded whole to export; give --export-from last (the best "
                "checkpoint is still kept, in the run's S3 prefix)"
            )
        if held_out.export_from == "best" and not held_out.keep_best:
            raise SpecError(
                "--export-from best with --keep-best false: the best checkpoint would not be kept to export from; "
                "drop --keep-best false, or give --export-from last"
            )
        if held_out.early_stop_delta is not None and held_out.early_stop_patience is None:
            raise SpecError(
                f"--early-stop-delta {held_out.early_stop_delta}: it sets what counts for --early-stop-patience; "
                "give --early-stop-patience K too (or drop it)"
            )
        return
    why = "the run does not evaluate: give --eval-fraction F or --eval-data PATH (vision: drop --synthetic)"
    for flag, value in (
        ("--keep-best", held_out.keep_best),
        ("--export-from", held_out.export_from == "best" or None),
        ("--early-stop-patience", held_out.early_stop_patience),
        ("--early-stop-delta", held_out.early_stop_delta),
    ):
        if value:
            raise SpecError(f"{flag}: {why}, or drop {flag}")
