"""DeepSpeed ZeRO-1's glue (training/common/zero.py) without processes: the engine's configuration, how many ranks
wrote a checkpoint, and the set-up that builds DeepSpeed. With processes: tests/e2e/test_bert_train.py."""

from __future__ import annotations

import pytest

from training.common.zero import TAG, engine_config, saved_world_size


def test_the_engine_steps_when_the_trainer_says_and_partitions_the_optimizer_only():
    config = engine_config(micro_batch_size=16, micro_steps=24, grad_clip=1.0, bf16=True)
    assert config["zero_optimization"] == {"stage": 1}
    assert config["managed_gradient_accumulation"] is False  # the trainer's step is the boundary
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (16, 24)
    assert config["gradient_clipping"] == 1.0 and config["bf16"] == {"enabled": True}
    assert "train_batch_size" not in config  # a rank's share may be one short of the others' (uneven batches)


@pytest.mark.parametrize("prefix", ["", "bf16_"])
def test_a_checkpoint_knows_how_many_ranks_wrote_it(tmp_path, prefix):
    checkpoint = tmp_path / "step-00000020"
    (checkpoint / TAG).mkdir(parents=True)
    for rank in range(4):
        (checkpoint / TAG / f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"x")
    (checkpoint / TAG / "mp_rank_00_model_states.pt").write_bytes(b"x")
    assert saved_world_size(checkpoint) == 4


def test_the_set_up_builds_the_deepspeed_the_project_pins():
    """`make setup` builds DeepSpeed itself (its CPU op compiled in) before installing the project: the same
    version, or pip would replace it with an op-less build."""
    import re
    import tomllib

    from tests.helpers.paths import REPO

    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (pinned,) = [pin.split("==")[1] for pin in pins if pin.startswith("deepspeed==")]
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^DEEPSPEED_VERSION = (\S+)$", makefile, re.M).group(1) == pinned
    assert "DS_BUILD_SHM_COMM=" in makefile and "--no-build-isolation deepspeed==$(DEEPSPEED_VERSION)" in makefile
