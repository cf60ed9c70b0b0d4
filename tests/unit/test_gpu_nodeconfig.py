"""The GPU nodes' NodeConfig (terraform/modules/gpu-nodegroup/nodeconfig.yaml) as nodeadm reads it: its API
(node.eks.aws/v1alpha1, awslabs/amazon-eks-ami nodeadm/doc/api.md), and its numbers after nodeadm's merge, which
goes through JSON into Go's float64 (nodeadm/internal/util/merge.go) before containerd reads them as uint64."""

from __future__ import annotations

import yaml

from tests.helpers.paths import REPO

NODECONFIG = REPO / "terraform" / "modules" / "gpu-nodegroup" / "nodeconfig.yaml"
# nodeadm's own base runtime spec (nodeadm/internal/containerd/base-runtime-spec.json): its one rlimit
NODEADM_NOFILE = {"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 1048576}
UINT64_MAX = 2**64 - 1


def after_merge(value: int) -> int:
    """What containerd reads after nodeadm's float64 round trip (or a value no uint64 holds)."""
    return int(float(value))


def test_the_memlock_limit_survives_nodeadms_merge_and_nofile_keeps_nodeadms_values():
    config = yaml.safe_load(NODECONFIG.read_text())
    assert (config["apiVersion"], config["kind"]) == ("node.eks.aws/v1alpha1", "NodeConfig")
    rlimits = {r["type"]: r for r in config["spec"]["containerd"]["baseRuntimeSpec"]["process"]["rlimits"]}
    assert rlimits["RLIMIT_NOFILE"] == NODEADM_NOFILE  # the merge replaces the list: nodeadm's entry is repeated
    memlock = rlimits["RLIMIT_MEMLOCK"]
    assert memlock["soft"] == memlock["hard"] >= 2**40  # more than any p5 host's memory (2 TiB)
    assert after_merge(memlock["hard"]) == memlock["hard"] <= UINT64_MAX
    assert after_merge(UINT64_MAX) > UINT64_MAX  # RLIM_INFINITY would not survive it
