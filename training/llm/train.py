"""Fine-tune Llama 2 with Accelerate FSDP. Run under torchrun (the launcher does this for you):

    torchrun --nproc-per-node 2 -m training.llm.train --run-dir runs/demo \
        --dataset data.jsonl --model-config config.json --steps 60
"""

from __future__ import annotations

from training.common.cli import parse_dataclass
from training.common.lifecycle import die_with_parent, exit_finished

from .config import TrainConfig
from .trainer import Trainer


def main(argv: list[str] | None = None) -> None:
    config = parse_dataclass(TrainConfig, argv)
    die_with_parent()
    Trainer(config).fit()
    exit_finished()


if __name__ == "__main__":
    main()
