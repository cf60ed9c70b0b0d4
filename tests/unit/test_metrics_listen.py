"""Where a rank's /metrics listens: this machine only on the local target, every interface on EKS."""

from __future__ import annotations

from tests.helpers.containers import free_port
from tests.helpers.sockets import listening_addresses
from training.common.metrics import MetricsSink, metrics_address


def test_the_local_target_serves_metrics_on_loopback_only(tmp_path):
    assert metrics_address("local") == "127.0.0.1" and metrics_address("eks") == "0.0.0.0"
    port = free_port()
    MetricsSink(tmp_path, {"run_id": "r"}, True, port, metrics_address("local"))
    assert listening_addresses(port) == {"127.0.0.1"}
