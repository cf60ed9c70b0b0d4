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


def test_the_fsx_csi_role_may_change_only_this_stacks_file_system():
    """The policy document is a data source (mocked in `terraform test`), so its scope is read from the HCL:
    UpdateFileSystem/TagResource carry a tag condition, and the infra stack passes its own stack-id tag."""
    import hcl2

    from tests.helpers.paths import REPO

    terraform = REPO / "terraform"
    eks = hcl2.load((terraform / "modules" / "eks" / "main.tf").open())
    documents = {
        name.strip('"'): body for block in eks["data"] for named in block.values() for name, body in named.items()
    }
    (writes,) = [s for s in documents["fsx_csi"]["statement"] if '"fsx:UpdateFileSystem"' in s["actions"]]
    (condition,) = [d['"condition"'] for d in writes["dynamic"]]
    (content,) = condition["content"]
    assert content["test"] == '"StringEquals"' and content["variable"] == '"aws:ResourceTag/${condition.value.key}"'
    infra = (terraform / "stacks" / "infra" / "main.tf").read_text()
    assert 'fsx_scope_tag         = { key = "trainkit:stack-id", value = var.stack_id }' in infra
    assert '"trainkit:stack-id" = var.stack_id' in infra  # the tag every resource (FSx included) carries
