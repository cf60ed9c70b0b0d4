"""Fine-tune Llama 2 with Accelerate FSDP. Run under torchrun (the launcher does this for you), from the
run folder the launcher prepared:

    torchrun --nproc-per-node 2 -m training.llm.train --spec runs/<run-id>/spec.json
"""

from __future__ import annotations

from transformers.utils import logging as hf_logging

from training.common.job import parse_worker_arguments
from training.common.lifecycle import die_with_parent, exit_finished

from .trainer import Trainer


def main(argv: list[str] | None = None) -> None:
    job, run_dir = parse_worker_arguments(argv, __doc__.splitlines()[0])
    die_with_parent()
    # One progress indicator per run (rank 0's steps): not a second bar for the final model's shards.
    hf_logging.disable_progress_bar()
    Trainer(job, run_dir).fit()
    exit_finished()


if __name__ == "__main__":
    main()
