"""`invoke nccl-test` in-process: the NCCL init-log check on recorded logs (EFA used / socket fallback, with the
cause), nccl-tests' bandwidth definitions, message sizes, bad input, and the pass/fail/warn verdict."""

from __future__ import annotations

import pytest

from tests.helpers.paths import TESTS
from training.comms.nccl_log import check_init_log
from training.comms.report import GLOO_ON_EFA, verdict
from training.comms.sweep import bandwidths, bus_factor, expected_busbw, message_sizes
from trainkit.errors import SpecError
from trainkit.workloads import nccl_test as nccltest

LOGS = TESTS / "data" / "nccl"


def test_a_log_where_nccl_selected_the_plugin_over_efa_passes():
    check = check_init_log((LOGS / "efa-selected.log").read_text())
    assert check.ok and check.network == "Libfabric" and check.cause is None


def test_no_efa_device_in_the_pod_fails_with_that_cause():
    check = check_init_log((LOGS / "socket-pod-id-link.log").read_text())
    assert not check.ok and check.network == "Socket"
    assert "no EFA device in the pod" in check.cause and "vpc.amazonaws.com/efa" in check.cause


def test_a_socket_fallback_on_the_pod_identity_link_is_named():
    lines = (LOGS / "socket-pod-id-link.log").read_text().splitlines()
    text = "\n".join(line for line in lines if "NET/OFI" not in line)  # no plugin lines: only the fallback
    check = check_init_log(text)
    assert not check.ok and "pod-id-link0" in check.cause and "NCCL_SOCKET_IFNAME" in check.cause


def test_a_missing_plugin_is_named():
    check = check_init_log((LOGS / "plugin-missing.log").read_text())
    assert not check.ok and "LD_LIBRARY_PATH" in check.cause


def test_libfabric_without_the_efa_provider_does_not_pass():
    text = (LOGS / "efa-selected.log").read_text().replace("provider is efa", "provider is tcp")
    assert not check_init_log(text).ok


def test_a_log_without_the_network_line_says_how_to_get_it():
    check = check_init_log("host:1:1 [0] NCCL INFO NCCL version 2.29.7+cuda13.0\n")
    assert not check.ok and "NCCL_DEBUG=INFO" in check.cause


def test_bus_bandwidth_follows_nccl_tests():
    # PERFORMANCE.md: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n, on the whole buffer
    assert bus_factor("all_reduce", 16) == pytest.approx(30 / 16)
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    algbw, busbw = bandwidths("all_reduce", 2 * 2**30, 0.0097, 16)
    assert algbw == pytest.approx(2 * 2**30 / 0.0097 / 1e9) and busbw == pytest.approx(algbw * 30 / 16)


def test_message_sizes_are_whole_float32_parts_per_rank():
    assert message_sizes(8, 64, 2) == [8, 16, 32, 64]
    assert message_sizes(1, 64, 3) == [12, 24, 60]  # multiples of 4 x 3 bytes, at least one element per rank
    assert all(size % (4 * 8) == 0 for size in message_sizes(8, 2**34, 8))


@pytest.mark.parametrize(
    ("text", "expected"), [("8", 8), ("64K", 65536), ("4M", 4 * 2**20), ("16G", 16 * 2**30), ("2GiB", 2 * 2**30)]
)
def test_sizes_take_binary_suffixes(text, expected):
    assert nccltest.parse_size(text, "--max-bytes") == expected


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: nccltest.parse_size("lots", "--max-bytes"), "--max-bytes 'lots': a positive size"),
        (lambda: nccltest.parse_size("0", "--min-bytes"), "--min-bytes '0'"),
        (lambda: nccltest.check_inputs(1, 1, "all_reduce", 8, 64, 5), "at least two processes"),
        (lambda: nccltest.check_inputs(2, 1, "broadcast", 8, 64, 5), "--ops 'broadcast'"),
        (lambda: nccltest.check_inputs(2, 1, "all_reduce", 64, 8, 5), "--min-bytes (64) is above --max-bytes (8)"),
        (lambda: nccltest.check_inputs(2, 1, "all_reduce", 8, 64, 0), "--iters 0"),
    ],
)
def test_bad_input_says_what_to_change(call, message):
    with pytest.raises(SpecError) as raised:
        call()
    assert message in str(raised.value)


def record(busbw_at_2gib: float, net: dict | None = None, backend: str = "nccl") -> dict:
    row = {"op": "all_reduce", "size_bytes": 2 * 2**30, "time_us": 1.0, "algbw_gbps": 1.0}
    rows = [{**row, "busbw_gbps": busbw_at_2gib}]
    return {"backend": backend, "nodes": 2, "results": rows, **({"net": net} if net else {})}


def test_verdict_fails_without_efa_and_warns_below_half_the_published_figure():
    expect = nccltest.expectations("p5.48xlarge", 2)
    assert expect == ["--expect-efa", "--expect-busbw", f"{2 * 2**30}:443.7"]
    published = expected_busbw(expect[2])
    no_efa = {"rank-3": {"network": "Socket", "efa": False, "cause": "NCCL fell back to TCP sockets"}}
    failures, warnings = verdict(record(100.0, no_efa), True, published)
    assert failures == ["rank-3: NCCL did not use EFA (network Socket): NCCL fell back to TCP sockets"]
    assert warnings and "below half of the published 443.7 GB/s" in warnings[0]
    efa = {"rank-0": {"network": "Libfabric", "efa": True, "cause": None}}
    assert verdict(record(440.0, efa), True, published) == ([], [])
    assert verdict(record(0.01), False, None) == ([], [])  # locally: nothing to compare with
    assert nccltest.expectations("p4d.24xlarge", 1) == ["--expect-efa"]  # one node: no two-node figure


def test_a_sweep_over_gloo_where_efa_is_expected_fails_saying_the_pods_saw_no_gpu():
    failures, _ = verdict(record(1.0, backend="gloo"), True, None)
    assert failures == [GLOO_ON_EFA] and "nvidia.com/gpu" in failures[0]


def test_a_real_nccl_2_28_log_without_the_plugin_is_named():
    """Recorded on a lent H100 (tests/data/nccl/README.md): NCCL 2.28.9 looks for libnccl-net.so, finds no IB
    device and settles on sockets."""
    text = (LOGS / "h100-no-plugin-2.28.9.log").read_text()
    assert "NCCL version 2.28.9+cuda13.0" in text
    check = check_init_log(text)
    assert not check.ok and check.network == "Socket" and "LD_LIBRARY_PATH" in check.cause


def test_a_rank_without_an_init_log_fails_the_check():
    check = check_init_log("")
    assert not check.ok and "wrote no NCCL init log" in check.cause
