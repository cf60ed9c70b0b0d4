"""The shipped Accelerate YAMLs load with Accelerate's own config class and match the trainer."""

from __future__ import annotations

import json

import pytest
from accelerate.commands.config.config_args import ClusterConfig

from tests.helpers.paths import REPO
from training.llm.model import decoder_layer_class, load_config
from training.registry import REGISTRY

CONFIGS = REPO / "training" / "configs"


@pytest.mark.parametrize("name", ["fsdp.yaml", "ddp.yaml"])
def test_accelerate_loads_the_config(name):
    config = ClusterConfig.from_yaml_file(CONFIGS / name)
    assert config.mixed_precision == "bf16" and config.rdzv_backend == "c10d"


def test_fsdp_config_matches_what_the_trainer_builds_for_llama_2(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(REGISTRY["llama2-7b"].arch.hf_config()))
    fsdp = ClusterConfig.from_yaml_file(CONFIGS / "fsdp.yaml").fsdp_config
    assert fsdp["fsdp_version"] == 2
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == decoder_layer_class(load_config(str(config), None))
    assert fsdp["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
