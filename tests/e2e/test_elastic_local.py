"""Several torchrun agents ("nodes") on this machine meeting at a real rendezvous: c10d or a real etcd."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO
from tests.helpers.product import invoke, only_run_dir, read_jsonl
from training.spec import RANK_LOGS_DIR
from trainkit.services import EtcdServer


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    with EtcdServer(tmp_path_factory.mktemp("etcd") / "data") as server:
        yield server.endpoint


def rdzv_flags(backend: str, etcd: str) -> list[str]:
    return ["--rdzv", "etcd", "--rdzv-endpoint", etcd] if backend == "etcd" else ["--rdzv", "c10d"]


@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_two_nodes_train_as_one_job_with_the_same_losses_as_one_node(backend, etcd, tiny_run, tmp_path):
    flags = ["--nodes", "2", "--nproc", "1", "--steps", "8", "--metrics-port=0", *rdzv_flags(backend, etcd)]
    result = invoke("train", "--runs-dir", str(tmp_path), *flags)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 8
    assert summary["sharding"]["local_params"] * 2 == summary["sharding"]["total_params"]
    per_node = sorted(p.name for p in (run_dir / "logs").iterdir() if p.name != RANK_LOGS_DIR)  # ranks/: logs
    assert per_node == ["node-0", "node-1"]
    # The same global batches over the same world size: the warmup steps (LR independent of the
    # run length) match the session's single-node, two-process run.
    two_nodes = {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl")}
    one_node = {r["step"]: r["loss"] for r in read_jsonl(tiny_run / "metrics.jsonl")}
    for step in range(1, 7):
        assert abs(two_nodes[step] - one_node[step]) <= 1e-4, (step, two_nodes[step], one_node[step])


def test_a_second_job_with_a_finished_jobs_name_runs(etcd, tmp_path):
    """Same --run-id against the same etcd: each submission gets its own rendezvous id."""
    flags = ["--run-id", "nightly", "--nodes", "1", "--nproc", "1", "--steps", "2", "--metrics-port=0"]
    for attempt in ("first", "second"):
        result = invoke("train", "--runs-dir", str(tmp_path / attempt), *flags, *rdzv_flags("etcd", etcd))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert json.loads((tmp_path / attempt / "nightly" / "summary.json").read_text())["steps"] == 2


def test_reusing_a_closed_rendezvous_id_is_what_fails_without_unique_ids(etcd, tmp_path):
    """The failure the unique ids prevent, measured with plain torchrun on the same etcd."""
    script = tmp_path / "noop.py"
    script.write_text("print('worker ran')\n")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "etcd-v2",
        "--rdzv-endpoint",
        etcd,
        "--rdzv-id",
        "fixed-job-name",
        str(script),
    ]
    first = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and "worker ran" in first.stdout, first.stderr[-2000:]
    second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert second.returncode != 0 and "RendezvousClosedError" in second.stderr
    assert "worker ran" not in second.stdout
