"""Which records --eval-fraction holds out of a dataset (issue 52): chosen by record, before packing, the same on
every rank, after every restart and at any node count. Torch-free, and numpy only when records are chosen: the
launcher checks the counts with it, and the platform's images (the idle guard's) read `evaluates` without numpy."""

from __future__ import annotations

from training.common.failure import DataError
from training.spec import Job


def held_out_records(count: int, fraction: float, seed: int):
    """The indices, in order, of the records --eval-fraction holds out of `count`: round(fraction x count) of them,
    the first of a permutation seeded by the run's seed (its own generator: no other random state moves). The same
    on every rank, after every restart and at any node count; refused when it would hold out none or all."""
    held = round(fraction * count)
    if held < 1 or held >= count:
        keeps = "no record to evaluate on" if held < 1 else "no record to train on"
        raise DataError(
            f"--eval-fraction {fraction} of {count} records holds out {held} and leaves {keeps}; give a fraction "
            f"that holds out between 1 and {count - 1} of them, or --eval-data"
        )
    import numpy as np

    return np.sort(np.random.default_rng(seed).permutation(count)[:held])


def has_held_out(job: Job) -> bool:
    """Whether the job evaluates a language model on held-out records (--eval-data or --eval-fraction)."""
    return bool(job.evaluation.data or job.evaluation.fraction)


def evaluates(job: Job) -> bool:
    """Whether the job's workers evaluate: its family says (a launcher side's `evaluates`, vision's val/ split), else
    held-out text (--eval-data or --eval-fraction) and an interval that is not 0."""
    from training.families import family_of, launcher_hook

    says = launcher_hook(family_of(job.model.family), "evaluates") if job.model.family else None
    return (says(job) if says else has_held_out(job)) and job.evaluation.interval != 0
