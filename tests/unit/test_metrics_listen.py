"""Where a rank's /metrics listens: this machine only on the local target, every interface on EKS."""

from __future__ import annotations

import socket

from training.common.metrics import MetricsSink, metrics_address


def listening_address(port: int) -> str:
    """The local address of the TCP socket listening on `port`, from /proc/net/tcp (hex, little-endian)."""
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if int(hex_port, 16) == port and state == "0A":  # LISTEN
            return socket.inet_ntoa(bytes.fromhex(address)[::-1])
    raise AssertionError(f"nothing listens on {port}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_local_target_serves_metrics_on_loopback_only(tmp_path):
    assert metrics_address("local") == "127.0.0.1" and metrics_address("eks") == "0.0.0.0"
    port = free_port()
    MetricsSink(tmp_path, {"run_id": "r"}, True, port, metrics_address("local"))
    assert listening_address(port) == "127.0.0.1"
