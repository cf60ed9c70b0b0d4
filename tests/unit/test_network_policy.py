"""Who may connect to a job's pods: the platform's default deny (terraform/stacks/platform) and each submission's
own policy (trainkit/backends/eks/submission.py), read as the cluster reads them (tests/helpers/network_policy.py,
whose rules the namespaced stand-in enforces with each pod's own packet filter)."""

from __future__ import annotations

from ipaddress import ip_address, ip_network

from tests.helpers.eks import job_for
from tests.helpers.network_policy import Endpoint, ingress_rules, selects
from tests.helpers.platform_stack import manifests
from trainkit.backends import job_from_flags as build_spec
from trainkit.backends.eks import cluster, render, submission

PLATFORM = [m for _, m in manifests() if m["kind"] == "NetworkPolicy"]


def _pod(namespace: str, labels: dict, address: str, ports: dict | None = None) -> Endpoint:
    return Endpoint(namespace, labels, address, f"ns-{address}", ports or {})


def _sources(rules: list[str] | None) -> set[str]:
    return {rule.split()[3] + (rule.split(" --dport ")[1].split()[0] if "--dport" in rule else "") for rule in rules}


def test_a_submissions_pods_admit_each_other_and_prometheus_on_metrics_ports_and_no_other_job():
    spec = build_spec({"target": "eks", "model": "llama2-7b", "nodes": "2", "run_id": "mine", "metrics_port": "9400"})
    job = job_for({"model": "llama2-7b", "nodes": "2", "run_id": "mine", "metrics_port": "9400"})
    labels = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"]
    policy = submission.render_peer_policy(spec, "fixed-rdzv-id", "0a1b2c3d4e")
    policy["metadata"]["namespace"] = spec.placement.namespace
    assert selects(policy["spec"]["podSelector"], labels)
    # The same run submitted again is another rendezvous: its pods are not this submission's peers, even when the
    # run id is longer than a label value.
    assert not selects(policy["spec"]["podSelector"], {**labels, render.LABEL_RDZV: "mine-other"})
    long = "r" * 70
    assert render.rdzv_label(f"{long}-0a1b2c3d") != render.rdzv_label(f"{long}-4e5f6a7b")
    ports = {f"metrics-{r}": (9400 + r, "TCP") for r in range(8)}
    mine = [_pod("trainkit-jobs", labels, f"10.0.1.{i}", ports) for i in (1, 2)]
    other = _pod("trainkit-jobs", {**labels, render.LABEL_RDZV: "theirs"}, "10.0.1.9")
    prometheus = _pod(cluster.MONITORING_NAMESPACE, {"app": "prometheus"}, "10.0.2.1")
    pods = [*mine, other, prometheus]
    rules = ingress_rules(mine[0], [*PLATFORM, policy], pods)
    assert rules[-1] == "-A INPUT -j DROP"
    admitted = _sources(rules[2:-1])
    assert {"10.0.1.1/32", "10.0.1.2/32"} <= admitted and not any(s.startswith("10.0.1.9") for s in admitted)
    assert {f"10.0.2.1/32{9400 + r}" for r in range(8)} <= admitted and "10.0.2.1/32" not in admitted
    # Without its own policy a pod of the namespace admits nothing (the platform's default deny)...
    assert ingress_rules(other, PLATFORM, pods)[2:] == ["-A INPUT -j DROP"]
    # ...and a pod in a namespace no policy selects is not isolated.
    assert ingress_rules(prometheus, [*PLATFORM, policy], pods) is None


def test_selectors_blocks_and_named_ports_as_the_api_reference_defines_them():
    assert selects({}, {"a": "1"}) and not selects(None, {"a": "1"})
    expressions = {
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["x"]},
            {"key": "b", "operator": "DoesNotExist"},
        ]
    }
    assert selects(expressions, {"tier": "x"}) and not selects(expressions, {"tier": "x", "b": "1"})
    target = _pod("n", {"app": "t"}, "10.0.0.5", {"web": (8080, "TCP")})
    policy = {
        "metadata": {"namespace": "n"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "t"}},
            "ingress": [
                {"from": [{"ipBlock": {"cidr": "10.1.0.0/16", "except": ["10.1.2.0/24"]}}], "ports": [{"port": "web"}]}
            ],
        },
    }
    rules = ingress_rules(target, [policy], [target])
    blocks = [ip_network(rule.split()[3]) for rule in rules if "-s " in rule]
    assert any(ip_address("10.1.3.7") in block for block in blocks)
    assert not any(ip_address("10.1.2.7") in block or ip_address("10.2.0.1") in block for block in blocks)
    assert all("--dport 8080" in rule for rule in rules if "-s " in rule)
