"""`invoke nccl-test`: locally (`--nodes 2 --nproc 2`), a real sweep over gloo between two torchrun agents (4
processes), whose report is checked against nccl-tests' formulas from the times it measured; on EKS, the job as
a cluster following the training operator runs it."""

from __future__ import annotations

import json

import pytest

from tests.helpers.eks import IMAGE
from tests.helpers.product import invoke, only_run_dir
from training.comms.report import GLOO_ON_EFA
from training.comms.sweep import OPS, bus_factor, message_sizes
from trainkit.services import EtcdServer


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


def test_on_eks_a_sweep_that_saw_no_gpu_fails_the_job_on_every_node_with_its_report_on_fsx(fake, tmp_path):
    """The PyTorchJob of `invoke nccl-test --target eks`, run by a cluster that follows training-operator v1.9.4
    (tests/helpers/kube_api.py) on this CPU machine: the pods' torchrun agents meet at a real etcd and sweep over
    gloo; on p5 nodes the sweep expects NCCL over EFA, so rank 0 writes the report on FSx with the cause and every
    rank exits 1; restartPolicy Never fails the job at once (nothing reruns)."""
    with EtcdServer(tmp_path / "etcd") as etcd:
        flags = ["--target", "eks", "--nodes", "2", "--nproc", "1", "--image", IMAGE, "--run-id", "fabric"]
        flags += ["--rdzv", "etcd", "--rdzv-endpoint", fake.reach(etcd.endpoint), "--max-bytes", "16K", "--iters", "2"]
        submitted = invoke("nccl-test", *flags)
        assert submitted.returncode == 0, submitted.stderr
        assert "submitted trainkit-jobs/fabric: 2 x p5.48xlarge, 1 processes each" in submitted.stdout
        assert "runs/fabric/table.md" in submitted.stdout
        job = fake.jobs[("trainkit-jobs", "fabric")]
        fake.wait(lambda: job["status"]["conditions"][-1]["type"] == "Failed", 180, "the job to fail")
        # backoffLimit 0: the operator's ReconcileJobs fails the job at the first failed pod (common/job.go)
        message = "Job fabric has failed because it has reached the specified backoff limit"
        assert job["status"]["conditions"][-1]["message"] == message
        assert all(pod.restarts == 0 for pod in fake.pods.values())
        run = fake.fsx / "runs" / "fabric"
        record = json.loads((run / "results.json").read_text())
        assert (record["backend"], record["world_size"], record["nodes"]) == ("gloo", 2, 2)
        assert record["expected"] == {"efa": True, "busbw": [2 * 2**30, 443.7]}
        assert record["verdict"] == {"failures": [GLOO_ON_EFA], "warnings": []}
        assert (run / "table.md").read_text().count("| all_reduce |") == len(message_sizes(8, 16384, 2))
        assert (run / "busbw.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # Every agent's logs are on FSx under its pod's name, and where each rank's files are (logs --rank).
        assert {p.name for p in (run / "logs").iterdir()} == {"fabric-worker-0", "fabric-worker-1", "ranks"}
        assert sorted(p.name for p in (run / "logs" / "ranks").iterdir()) == ["0.json", "1.json"]
        logs = [log.read_text() for log in (run / "logs").rglob("stdout.log")]
        assert len(logs) == 2 and sum(f"FAILED: {GLOO_ON_EFA}" in text for text in logs) == 1  # rank 0's
        status = invoke("status", "--run-id", "fabric")
        assert status.stdout.startswith("job trainkit-jobs/fabric (run fabric): failed (Failed)"), status.stdout
