"""Elastic fault tolerance, proven with real processes: every fault scenario on both rendezvous backends.

One `invoke bench elastic` run (one scenario at a time, into temporary files, beside the rest of the
suite) drives the whole matrix: a real two-node elastic job per scenario, a real etcd for the etcd
backend, real SIGKILLs and SIGTERMs. Each scenario has a hard timeout inside the harness; the test asserts
what the harness measured.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainkit.bench import chaos

SETTINGS = chaos.Settings()
PAIRS = [(name, backend) for backend in chaos.BACKENDS for name in chaos.SCENARIOS]


@pytest.fixture(scope="module")
def bench(chaos_matrix):
    """The benchmark command itself, writing to a temporary JSON file and table file; started in the
    background early in the session (tests/helpers/chaos_bench.py), these tests run last."""
    return chaos_matrix


def result_of(record: dict, scenario: str, backend: str) -> dict:
    found = [r for r in record["results"] if r["scenario"] == scenario and r["backend"] == backend]
    assert len(found) == 1, found
    return found[0]


def test_the_benchmark_command_covers_the_matrix_and_writes_the_docs_table(bench):
    result, record, table = bench
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert sorted((r["scenario"], r["backend"]) for r in record["results"]) == sorted(PAIRS)
    assert table.read_text() == chaos.table_file(record)
    assert record["settings"]["steps"] == SETTINGS.steps
    # The temporary runs (checkpoints, etcd data) of a matrix that went as expected are removed.
    workdir = Path(re.search(r"runs under (\S+)", result.stdout).group(1))
    assert workdir.name.startswith("trainkit-chaos-") and not workdir.exists(), result.stdout[-2000:]


@pytest.mark.parametrize(("scenario", "backend"), PAIRS)
def test_scenario(bench, scenario, backend):
    _result, record, _readme = bench
    r = result_of(record, scenario, backend)
    assert r["ok"], r
    if r["expected"] == "error":
        # c10d's store lives in node 0's agent: losing it ends the job with a clear error, quickly.
        assert "single point of failure" in r["error"] and r["seconds_to_error"] < 30, r
        return
    assert r["outcome"] == "finished" and r["final_step"] == SETTINGS.steps, r
    assert r["steps_lost"] <= SETTINGS.checkpoint_interval, r
    assert r["recovery_s"] is not None and r["recovery_s"] <= 60, r
    # Same data and steps as the uninterrupted run, whatever the world size on the way.
    assert abs(r["loss_delta"]) <= 1e-4, r
    if scenario == "store-loss":  # etcd restarted: training did not even stop
        assert r["restarts"] == 0
    else:
        assert r["restarts"] >= 1
    if scenario == "agent-term":  # the stopping node's ranks saved the step they were at
        assert r["steps_lost"] == 0
    if scenario == "node-return":  # scaled back up to both nodes
        assert r["final_world_size"] == 2 and r["restarts"] == 2
    elif scenario in ("node-kill", "agent-kill", "agent-term", "node0-kill"):  # carried on with the survivor
        assert r["final_world_size"] == 1
