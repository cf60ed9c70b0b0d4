"""The workers' one entry point: train the model a run's spec names, with its family's trainer
(training/families.py). Run under torchrun (the launcher does this for you), from the run folder the launcher prepared:

    torchrun --nproc-per-node 2 -m training --spec runs/<run-id>/spec.json
"""

from __future__ import annotations

from training.common.failure import reported
from training.common.lifecycle import die_with_parent, exit_finished
from training.families import family_of
from training.registry import load, model_entry
from training.spec import parse_worker_arguments


def main(argv: list[str] | None = None) -> None:
    job, run_dir = parse_worker_arguments(argv, __doc__.splitlines()[0])
    with reported():  # an error that ends this rank reaches the launcher in one line, even from a full volume
        die_with_parent()
        family = job.model.family or model_entry(job.model.name).family
        trainer = load(family_of(family).trainer)
        trainer(job, run_dir).fit()
    exit_finished()


if __name__ == "__main__":
    main()
