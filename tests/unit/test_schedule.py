"""The learning-rate schedule (training/common/schedule.py) and each family's floor (issue 50: the cosine ended at
0.111 of the peak where it said 0.1, and vision decays to 0 in its reference)."""

from __future__ import annotations

import pytest

from training.common.schedule import lr_multiplier
from training.common.trainer import Trainer
from training.encoder.trainer import BertTrainer
from training.llm.trainer import DecoderTrainer
from training.vision.trainer import VisionTrainer


@pytest.mark.parametrize("warmup, total", [(0, 2), (3, 13), (10, 1000)])
def test_cosine_peaks_after_warmup_and_lands_on_the_floor_at_the_last_step(warmup, total):
    for floor in (0.0, 0.1):
        steps = [lr_multiplier(step, warmup, total, "cosine", floor) for step in range(total)]
        assert steps[: warmup + 1][-1] == 1.0 and steps[-1] == pytest.approx(floor, abs=1e-12)
        assert steps[warmup:] == sorted(steps[warmup:], reverse=True)
    assert [lr_multiplier(s, 2, 5, "constant") for s in range(5)] == [0.5, 1.0, 1.0, 1.0, 1.0]


def test_each_family_has_its_references_floor():
    assert (DecoderTrainer.LR_FLOOR, VisionTrainer.LR_FLOOR, BertTrainer.LR_FLOOR) == (0.1, 0.0, 0.0)
    assert Trainer.LR_FLOOR == 0.0
