"""The EKS backend end to end against a local Kubernetes API server (tests/helpers/kube_api.py): a real
2-node job whose pods run here (the pod entry point, torchrun, an etcd rendezvous, training on CPU) is
submitted, loses a worker, is followed through status and logs, and stopped."""

from __future__ import annotations

import json
import signal

from tests.helpers.eks import IMAGE
from tests.helpers.product import invoke
from trainkit.services import EtcdServer


def test_submit_status_logs_restart_stop_end_to_end(fake, tmp_path):
    """A real 2-node job: pods run the pod entry point here, meet at a real etcd, lose a worker and go on."""
    with EtcdServer(tmp_path / "etcd") as etcd:
        flags = [
            "--target",
            "eks",
            "--model",
            "llama2-tiny",
            "--image",
            IMAGE,
            "--nodes",
            "2",
            "--nproc",
            "1",
            "--rdzv",
            "etcd",
            "--rdzv-endpoint",
            etcd.endpoint,
            "--metrics-port",
            "0",
            "--steps",
            "24",
            "--checkpoint-interval",
            "4",
            "--run-id",
            "e2e",
        ]
        submitted = invoke("train", *flags)
        assert submitted.returncode == 0, submitted.stderr
        assert "submitted trainkit-jobs/e2e: 2 x p5.48xlarge, 1 processes each, rendezvous etcd" in submitted.stdout
        run = fake.fsx / "runs" / "e2e"
        metrics = run / "metrics.jsonl"
        fake.wait(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 6, 120, "6 training steps")
        fake.pod("e2e-worker-1").kill(signal.SIGKILL)  # the node's agent and its worker die at once
        fake.wait(lambda: fake.pod("e2e-worker-1").restarts == 1, 30, "the kubelet to restart worker 1")
        status = invoke("status", "--run-id", "e2e")
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith("job trainkit-jobs/e2e (run e2e): ")
        assert "e2e-worker-1 exited with code -9; restarting" in status.stdout
        rows = {
            line.split()[0]: line.split() for line in status.stdout.splitlines()[1:] if line.strip().startswith("e2e-")
        }
        assert rows["e2e-worker-1"][2] == "1" and rows["e2e-worker-0"][2] == "0"  # restarts column
        assert rows["e2e-worker-0"][3] == fake.nodes[0]["metadata"]["name"]
        job = fake.jobs[("trainkit-jobs", "e2e")]
        fake.wait(lambda: job["status"]["conditions"][-1]["type"] == "Succeeded", 240, "the job to succeed")
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps"] == 24
        assert json.loads((run / "spec.json").read_text())["placement"]["target"] == "eks"
        assert (run / "logs" / "e2e-worker-0").is_dir() and (run / "logs" / "e2e-worker-1").is_dir()
        events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
        assert any(e["event"] == "resume" for e in events)  # the group re-formed after the loss

        leader = invoke("logs", "--run-id", "e2e")
        assert leader.returncode == 0, leader.stderr
        assert leader.stdout.startswith("==> e2e-worker-") and "(leader)" in leader.stdout.splitlines()[0]
        assert "group_rank=0" in leader.stdout and "summary: runs/e2e/summary.json" in leader.stdout
        rank1 = invoke("logs", "--run-id", "e2e", "--rank", "1")
        lines = rank1.stdout.splitlines()
        assert "(rank 1)" in lines[0] and all(line.startswith("[default0]:") for line in lines[1:])
        follow = invoke("logs", "--run-id", "e2e", "-f")  # the pod has ended, so follow returns
        assert follow.returncode == 0 and "summary: runs/e2e/summary.json" in follow.stdout

        stopped = invoke("stop", "--run-id", "e2e")
        assert stopped.returncode == 0 and "deleted job trainkit-jobs/e2e" in stopped.stdout
        assert ("trainkit-jobs", "e2e") not in fake.jobs and (run / "summary.json").exists()  # outputs stay
        assert invoke("status", "--run-id", "e2e").returncode == 2
