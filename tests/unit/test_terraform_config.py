"""Terraform's CLI configuration as trainkit writes it, and the instance table Python shares with Terraform;
no terraform binary runs here (tests/integration/test_terraform.py runs it)."""

from __future__ import annotations

from trainkit.infra.cli_config import find_provider_mirror, render_cli_config


def test_cli_config_uses_the_mirror_when_present_and_the_registry_otherwise(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    (mirror / "registry.terraform.io" / "hashicorp" / "aws").mkdir(parents=True)
    monkeypatch.setenv("TRAINKIT_TF_PROVIDER_MIRROR", str(mirror))
    assert find_provider_mirror() == mirror
    text = render_cli_config(mirror)
    assert f'path    = "{mirror}"' in text and 'exclude = ["registry.terraform.io/hashicorp/aws"]' in text
    monkeypatch.setenv("TRAINKIT_TF_PROVIDER_MIRROR", str(tmp_path / "empty"))
    assert find_provider_mirror() is None
    assert "filesystem_mirror" not in render_cli_config(None)


def test_python_and_terraform_read_one_instance_table():
    from trainkit.hardware import INSTANCE_TYPES

    assert INSTANCE_TYPES["p5.48xlarge"].efa_interfaces == 32 and INSTANCE_TYPES["p4d.24xlarge"].efa_interfaces == 4
    assert INSTANCE_TYPES["p5.48xlarge"].gpu_memory_gib == 80
