"""Terraform's CLI configuration as trainkit writes it, and the instance table Python shares with Terraform;
no terraform binary runs here (tests/integration/test_terraform.py runs it)."""

from __future__ import annotations

import re

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
    assert re.search(r'fsx_scope_tag\s+= \{ key = "trainkit:stack-id", value = var.stack_id \}', infra)
    assert '"trainkit:stack-id" = var.stack_id' in infra  # the tag every resource (FSx included) carries


def _infra_defaults() -> dict:
    """The infra stack's variables at their defaults, as `terraform show -json` of a plan lists them."""
    import hcl2

    from tests.helpers.paths import REPO

    blocks = hcl2.load((REPO / "terraform" / "stacks" / "infra" / "variables.tf").open())["variable"]
    return {name.strip('"'): body.get("default") for block in blocks for name, body in block.items()}


def test_the_plan_says_the_gpu_group_starts_empty_and_how_nodes_come_and_go():
    """`invoke infra.plan` at the stack's defaults: no node at first, each job asks for its nodes, the idle guard
    gives them back; with the guard off (or without the pod identity it needs) it says nothing scales them down."""
    from trainkit.infra.aws import describe_gpu_nodes

    defaults = _infra_defaults()
    said = describe_gpu_nodes(defaults)
    assert said == (
        "GPU node group: created with no nodes, so `make up` waits for no GPU capacity; `invoke train --target eks` "
        "asks it for each job's nodes (at most gpu_max_nodes = 2; they join in 10 to 15 minutes); the idle guard "
        "scales it to zero after 30 minutes with no job and idle GPUs"
    )
    for off in ({"idle_guard_minutes": None}, {"enable_pod_identity": False}):
        said = describe_gpu_nodes({**defaults, **off, "gpu_desired_nodes": 1})
        assert "created with 1 node(s), which `make up` waits for" in said
        assert said.endswith("nothing scales it down (the idle guard is off): scale it to 0 when you are done")
