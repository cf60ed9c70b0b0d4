"""Fine-tune Llama 2 with Accelerate FSDP. Run under torchrun (the launcher does this for you), from the
run folder the launcher prepared:

    torchrun --nproc-per-node 2 -m training.llm.train --spec runs/<run-id>/spec.json
"""

from __future__ import annotations

from training.common.failure import reported
from training.common.job import parse_worker_arguments
from training.common.lifecycle import die_with_parent, exit_finished
from training.common.run import record_log_files

from .trainer import LlamaTrainer


def main(argv: list[str] | None = None) -> None:
    job, run_dir = parse_worker_arguments(argv, __doc__.splitlines()[0])
    with reported():  # an error that ends this rank reaches the launcher in one line, even from a full volume
        record_log_files(run_dir)  # first: a failure while loading data is shown and found too
        die_with_parent()
        LlamaTrainer(job, run_dir).fit()
    exit_finished()


if __name__ == "__main__":
    main()
