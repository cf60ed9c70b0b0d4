"""The shipped Accelerate YAMLs load with Accelerate's own config class and match the trainer."""

from __future__ import annotations

import pytest
from accelerate.commands.config.config_args import ClusterConfig

from tests.helpers.paths import REPO
from training.llm.model import DECODER_LAYER

CONFIGS = REPO / "training" / "configs"


@pytest.mark.parametrize("name", ["fsdp.yaml", "ddp.yaml"])
def test_accelerate_loads_the_config(name):
    config = ClusterConfig.from_yaml_file(CONFIGS / name)
    assert config.mixed_precision == "bf16" and config.rdzv_backend == "c10d"


def test_fsdp_config_matches_what_the_trainer_builds():
    fsdp = ClusterConfig.from_yaml_file(CONFIGS / "fsdp.yaml").fsdp_config
    assert fsdp["fsdp_version"] == 2
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == DECODER_LAYER
    assert fsdp["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
