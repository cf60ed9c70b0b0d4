"""`invoke nccl-test --target local --nodes 2 --nproc 2`: a real sweep over gloo between two torchrun agents (4
processes), whose report is checked against nccl-tests' formulas from the times it measured."""

from __future__ import annotations

import json

import pytest

from tests.helpers.product import invoke, only_run_dir
from training.comms.sweep import OPS, bus_factor, message_sizes


def test_two_nodes_over_gloo_write_a_report_whose_bandwidths_follow_from_the_times(tmp_path):
    args = ["--nodes", "2", "--nproc", "2", "--runs-dir", str(tmp_path), "--max-bytes", "64K", "--iters", "3"]
    result = invoke("nccl-test", "--target", "local", *args, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = only_run_dir(tmp_path)
    record = json.loads((run / "results.json").read_text())
    assert (record["backend"], record["world_size"], record["nodes"]) == ("gloo", 4, 2)
    sizes = message_sizes(1024, 65536, 4)
    assert [(r["op"], r["size_bytes"]) for r in record["results"]] == [(op, s) for op in OPS for s in sizes]
    for row in record["results"]:
        seconds = row["time_us"] / 1e6
        assert row["algbw_gbps"] == pytest.approx(row["size_bytes"] / seconds / 1e9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * bus_factor(row["op"], 4))
    table = (run / "table.md").read_text().splitlines()
    assert sum(line.startswith("| all_reduce |") for line in table) == len(sizes)
    assert (run / "busbw.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"results: {run / 'results.json'}" in result.stdout
