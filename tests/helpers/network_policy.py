"""NetworkPolicy as a cluster enforces it, for the stand-ins whose pods each have a network namespace of their own
(tests/helpers/netns.py): which connections into a pod are admitted, written as that pod's own packet filter.

The rules, from Kubernetes' NetworkPolicy concept page and the networking.k8s.io/v1 API reference (v1.33):
- a policy selects the pods of its own namespace that match spec.podSelector (an empty selector: all of them);
  policyTypes defaults to ["Ingress"] (plus "Egress" when it has egress rules);
- a pod selected by no policy with Ingress is not isolated: every connection is admitted. One selected by any is
  isolated: a connection is admitted when some ingress rule of some policy that selects it admits it ("additive");
  replies to what the pod itself opened are always admitted (connections are tracked);
- a rule admits what matches any of its `from` peers (none or empty: every source) on any of its `ports` (none or
  empty: every port); a port is a number or the name of a container port of the pod, with endPort a range, and
  protocol TCP by default;
- a peer with only podSelector: pods of the policy's namespace; only namespaceSelector: every pod of the selected
  namespaces; both: pods matching the first in namespaces matching the second; ipBlock: the addresses in its cidr
  but not in its except list;
- selectors: matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist), all of them ANDed.
Every namespace carries kubernetes.io/metadata.name = its name (set by the API server since v1.21). Connections are
dropped, not refused, as the VPC CNI's policy agent does (its eBPF programs drop), so a refused peer times out.
"""

from __future__ import annotations

import ipaddress
import subprocess
from dataclasses import dataclass

from trainkit.backends.eks.render import NAMESPACE_NAME_LABEL


@dataclass(frozen=True)
class Endpoint:
    """A pod as the policies see it: namespace, labels, address, its network namespace and container ports."""

    namespace: str
    labels: dict
    address: str
    netns: str
    ports: dict  # container port name -> (number, protocol)


def selects(selector: dict | None, labels: dict) -> bool:
    """A label selector (None: matches nothing; {}: everything)."""
    if selector is None:
        return False
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        held = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values}
        held |= {"Exists": key in labels, "DoesNotExist": key not in labels}
        if not held[operator]:
            return False
    return True


def _types(policy: dict) -> list[str]:
    spec = policy["spec"]
    return spec.get("policyTypes") or (["Ingress", "Egress"] if spec.get("egress") else ["Ingress"])


def _sources(peer: dict, namespace: str, pods: list[Endpoint]) -> list[str]:
    """The networks (CIDRs) one peer admits."""
    if "ipBlock" in peer:
        block = ipaddress.ip_network(peer["ipBlock"]["cidr"])
        networks = [block]
        for excluded in peer["ipBlock"].get("except") or []:
            networks = [part for net in networks for part in _without(net, ipaddress.ip_network(excluded))]
        return [str(net) for net in networks]
    namespaces = peer.get("namespaceSelector")
    found = [
        pod
        for pod in pods
        if (
            selects(namespaces, {NAMESPACE_NAME_LABEL: pod.namespace})
            if namespaces is not None
            else pod.namespace == namespace
        )
        and selects(peer.get("podSelector", {}), pod.labels)
    ]
    return [f"{pod.address}/32" for pod in found]


def _without(network, excluded):
    if not network.overlaps(excluded):
        return [network]
    if excluded.supernet_of(network):
        return []
    return list(network.address_exclude(excluded))


def _ports(rule: dict, target: Endpoint) -> list[tuple[str, str]] | None:
    """(protocol, port or low:high) the rule admits on `target`; None: every port of every protocol."""
    ports = rule.get("ports")
    if not ports:
        return None
    admitted = []
    for port in ports:
        protocol = port.get("protocol", "TCP").lower()
        number = port.get("port")
        if number is None:
            admitted.append((protocol, ""))
        elif isinstance(number, str):
            if number in target.ports and target.ports[number][1].lower() == protocol:
                admitted.append((protocol, str(target.ports[number][0])))
        else:
            admitted.append((protocol, f"{number}:{port['endPort']}" if port.get("endPort") else str(number)))
    return admitted


def ingress_rules(target: Endpoint, policies: list[dict], pods: list[Endpoint]) -> list[str] | None:
    """The iptables INPUT rules that admit what the policies admit into `target`; None: it is not isolated."""
    selecting = [
        policy
        for policy in policies
        if policy["metadata"]["namespace"] == target.namespace
        and "Ingress" in _types(policy)
        and selects(policy["spec"].get("podSelector", {}), target.labels)
    ]
    if not selecting:
        return None
    rules = ["-A INPUT -i lo -j ACCEPT", "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"]
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            sources = (
                ["0.0.0.0/0"]
                if not peers
                else [s for peer in peers for s in _sources(peer, policy["metadata"]["namespace"], pods)]
            )
            ports = _ports(rule, target)
            for source in sources:
                if ports is None:
                    rules.append(f"-A INPUT -s {source} -j ACCEPT")
                for protocol, port in ports or []:
                    match = f" -m {protocol} --dport {port}" if port else ""
                    rules.append(f"-A INPUT -s {source} -p {protocol}{match} -j ACCEPT")
    return [*rules, "-A INPUT -j DROP"]


def enforce(policies: list[dict], pods: list[Endpoint]) -> None:
    """Each pod's packet filter, rewritten whole from the policies and the pods as they are now."""
    for pod in pods:
        rules = ingress_rules(pod, policies, pods) or []
        table = [
            "*filter",
            ":INPUT ACCEPT [0:0]",
            ":FORWARD ACCEPT [0:0]",
            ":OUTPUT ACCEPT [0:0]",
            *rules,
            "COMMIT",
            "",
        ]
        done = subprocess.run(
            ["ip", "netns", "exec", pod.netns, "iptables-restore", "-w"],
            input="\n".join(table),
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise RuntimeError(f"iptables-restore in {pod.netns} failed: {done.stderr.strip()}")
