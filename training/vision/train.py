"""Train an ImageNet classifier with Accelerate DDP. Run under torchrun (the launcher does this for you):

    torchrun --nproc-per-node 8 -m training.vision.train --run-dir runs/demo \
        --model-name resnet50 --data /fsx/imagenet --epochs 90
"""

from __future__ import annotations

from training.common.cli import parse_dataclass
from training.common.lifecycle import die_with_parent, exit_finished

from .config import VisionConfig
from .trainer import VisionTrainer


def main(argv: list[str] | None = None) -> None:
    config = parse_dataclass(VisionConfig, argv)
    die_with_parent()
    VisionTrainer(config).fit()
    exit_finished()


if __name__ == "__main__":
    main()
