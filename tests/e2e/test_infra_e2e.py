"""`make up PROFILE=aws` / `make down PROFILE=aws` against an AWS emulator (moto server on 127.0.0.1).

The round trip runs in the background from early in the session (tests/helpers/infra_round_trip.py: the
emulator, its tfvars, why some features are off for it, and the transient faults a proxy plants between Terraform
and the emulator); these tests, ordered last, read what each step did.
"""

from __future__ import annotations

import datetime
import json

from tests.helpers.infra_round_trip import FAULTS


def test_up_then_down_leaves_nothing(infra_round_trip_record):
    round_trip = infra_round_trip_record
    up = round_trip["up"]
    assert up["returncode"] == 0, up["stdout"][-4000:] + up["stderr"][-4000:]
    # Priced as `invoke plan` prices an EKS job: the Price List API's (its stand-in's) price, dated, and the standing
    # parts beside it (issue 55).
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    assert (
        f"Estimated cost: $51.23/hour for 1 x p5.48xlarge (on-demand, price list API, {today}); standing"
        in up["stdout"]
    )
    assert f"EKS control plane (1 cluster) $0.100 (price list API, {today})" in up["stdout"]
    # Read from the real plan's variables: its tfvars ask for one node, and without pod identity no guard runs.
    assert "GPU node group: created with 1 node(s), which `make up` waits for" in up["stdout"]
    assert "nothing scales it down (the idle guard is off)" in up["stdout"]
    config = round_trip["kubeconfig"]
    assert config is not None, "make up succeeded without writing the kubeconfig"
    assert config["current-context"] == "tk-e2e"
    assert config["users"][0]["user"]["exec"]["args"][:4] == ["eks", "get-token", "--cluster-name", "tk-e2e"]
    assert f"export KUBECONFIG={round_trip['kubeconfig_path']}" in up["stdout"]

    outputs = round_trip["outputs"]
    assert outputs["returncode"] == 0, outputs["stderr"]
    values = json.loads(outputs["stdout"])
    assert values["cluster_name"] == "tk-e2e" and values["efa_interfaces_per_node"] == 32
    # the platform's image repository is made with the guard off too: the etcd issuer runs from it
    assert set(values["ecr_repository_urls"]) == {"train", "data-prep", "idle-guard"}

    down = round_trip["down"]
    assert down["returncode"] == 0, down["stdout"][-4000:] + down["stderr"][-4000:]
    assert "audit of us-east-1 found nothing tagged trainkit:stack-id=trainkit-e2e" in down["stdout"]
    assert not round_trip["kubeconfig_after_down"]
    # Every planted fault happened (a throttled call during up; a dropped connection and a throttled deletion during
    # down) and was survived: the provider's own retries, as in a real run, no longer pinned to 1. They were enough:
    # make down's own second destroy (for what outlasts them) was not needed.
    assert "stopped on a transient error" not in down["stdout"]
    for step, faults in FAULTS.items():
        assert sorted(map(tuple, round_trip["faults"][step])) == sorted(faults.items()), round_trip["faults"]
