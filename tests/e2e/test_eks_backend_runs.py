"""The EKS backend end to end against a local Kubernetes API server that follows training-operator
v1.9.4's rules (tests/helpers/kube_api.py): a real 2-node job whose pods run here (the pod entry point,
torchrun, an etcd rendezvous, training on CPU) is submitted, loses a worker pod (which the operator replaces:
restartPolicy ExitCode), is followed through status and logs, and stopped; and a job whose leader is slow to
publish is still published whole although the operator ends the job when the first pod finishes."""

from __future__ import annotations

import json
import re
import signal

from tests.helpers.containers import processes_with
from tests.helpers.eks import IMAGE
from tests.helpers.platform_etcd import platform_etcd
from tests.helpers.product import invoke
from tests.helpers.tracked import steps_of, tracked_runs
from training.common.faults import HANG_ENV
from trainkit.services import EtcdServer


def job_flags(etcd: str | None, run_id: str, steps: int, *extra: str) -> list[str]:
    """`etcd`: host:port of the etcd the pods meet at (each pod has its own network: the test's etcd through the
    cluster network's gateway); None: the platform's (tests/helpers/platform_etcd.py), with the job's identity."""
    endpoint = ["--rdzv-endpoint", etcd] if etcd else []
    return [
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
        *endpoint,
        "--metrics-port",
        "0",
        "--steps",
        str(steps),
        "--run-id",
        run_id,
        *extra,
    ]


def leader_pod(fake, job: str) -> str:
    """The pod whose agent held group rank 0 in the last rendezvous round it logged (deleted pods too)."""
    for log in sorted(fake.root.glob(f"{job}-worker-*.log")):
        ranks = re.findall(r"group_rank=(\d+)", log.read_text())
        if ranks and ranks[-1] == "0":
            return log.stem
    raise AssertionError(f"no pod of {job} logged group rank 0")


def test_submit_status_logs_restart_stop_end_to_end(fake, tmp_path, gated_mlflow):
    """A real 2-node job: pods run the pod entry point here, meet at the platform's etcd (TLS, the job's own
    identity from the issuer: tests/helpers/platform_etcd.py), lose a worker and go on; it is tracked to an MLflow
    server that wants a token, which the pods get from the Secret `invoke secrets.mlflow-token` made."""
    stale = fake.fsx / "runs" / "e2e" / "failure.json"  # an earlier job of this run failed
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"cause": "DataError: old", "time": 1.0, "submission": "an-earlier-job"}))
    with platform_etcd(fake, tmp_path / "etcd.log") as etcd:
        # Evaluated at steps 8 and 16; no evaluation can improve by 100, so patience 1 stops it at step 16.
        early = ("--eval-fraction", "0.1", "--eval-interval", "8", "--eval-batches", "2", "--early-stop-patience", "1")
        early += ("--early-stop-delta", "100")
        (tmp_path / "mlflow-token").write_text(gated_mlflow.token)
        stored = invoke("secrets.mlflow-token", "--file", str(tmp_path / "mlflow-token"))
        assert stored.stdout.startswith("created Secret trainkit-jobs/mlflow-token;"), stored.stderr
        early += ("--track", "mlflow", "--tracking-uri", gated_mlflow.url)
        submitted = invoke("train", *job_flags(None, "e2e", 24, "--checkpoint-interval", "4", *early))
        assert submitted.returncode == 0, submitted.stderr
        assert "submitted trainkit-jobs/e2e: 2 x p5.48xlarge, 1 processes each, rendezvous etcd" in submitted.stdout
        # Issue 49: the platform's default deny and the submission's own policy (tests/helpers/network_policy.py):
        # the job's pods reach each other's sockets (its stores, NCCL's and gloo's), a pod of another job in the
        # namespace reaches none of them. Checked while the job starts, on a socket of the test's own in each pod.
        with fake.visiting_pod("trainkit-jobs", "other-job-0", {"trainkit/run-id": "other"}) as other:
            for pod, peer in (("e2e-worker-0", "e2e-worker-1"), ("e2e-worker-1", "e2e-worker-0")):
                with fake.serving(pod, 29555):
                    assert fake.connects(peer, pod, 29555) and not fake.connects(other, pod, 29555), pod
        run = fake.fsx / "runs" / "e2e"
        metrics = run / "metrics.jsonl"
        fake.wait(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 6, 120, "6 training steps")
        lost = fake.pod("e2e-worker-1")
        lost.kill(signal.SIGKILL)  # the node's pod entry point, agent and worker die at once: exit 137

        def replaced() -> bool:
            pod = fake.pods.get(("trainkit-jobs", "e2e-worker-1"))
            return pod is not None and pod is not lost and pod.phase == "Running"

        # restartPolicy ExitCode: 137 is retryable (>= 128), so the operator deletes the failed pod and creates it
        # again (training-operator v1.9.4 ReconcilePods); the Restarting condition gives way to Running.
        fake.wait(replaced, 30, "the operator to replace worker 1")
        assert lost.terminated["exitCode"] == 137 and fake.deleted == ["e2e-worker-1"]
        status = invoke("status", "--run-id", "e2e")
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith("job trainkit-jobs/e2e (run e2e): running (Running)")
        assert "restarts of running pods" not in status.stdout  # no in-place restarts to count under ExitCode
        rank1 = invoke("logs", "--run-id", "e2e", "--rank", "1")
        lines = rank1.stdout.splitlines()
        assert "(rank 1)" in lines[0] and all(line.startswith("[default0]:") for line in lines[1:])
        rows = {
            line.split()[0]: line.split() for line in status.stdout.splitlines()[1:] if line.strip().startswith("e2e-")
        }
        assert rows["e2e-worker-1"][2] == "0" and rows["e2e-worker-0"][2] == "0"  # a new pod, not a restarted one
        assert rows["e2e-worker-0"][3] == fake.nodes[0]["metadata"]["name"]
        job = fake.jobs[("trainkit-jobs", "e2e")]
        fake.wait(lambda: job["status"]["conditions"][-1]["type"] == "Succeeded", 240, "the job to succeed")
        assert [(c["type"], c["status"]) for c in job["status"]["conditions"]] == [
            ("Created", "True"),
            ("Running", "False"),
            ("Succeeded", "True"),
        ]
        assert job["status"]["conditions"][-1]["message"] == "PyTorchJob trainkit-jobs/e2e successfully completed."
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps"] == 16 and summary["stopped_early"]["step"] == 16, summary
        client, (tracked,) = tracked_runs(gated_mlflow.upstream, "e2e")  # one MLflow run through the pod's loss
        assert tracked.info.status == "FINISHED" and tracked.data.tags["trainkit.target"] == "eks"
        assert steps_of(client, tracked.info.run_id) == list(range(1, 17)), "each step once"
        assert gated_mlflow.token not in submitted.stdout + submitted.stderr + stored.stdout
        # a pod's termination message says how it ended (trainkit/run/node.py), and status reads it from the API
        best = summary["stopped_early"]["best_step"]
        ended = invoke("status", "--run-id", "e2e").stdout
        assert ended.startswith(
            f"job trainkit-jobs/e2e (run e2e): finished: stopped early at step 16, best at step {best} (Succeeded)"
        ), ended
        assert not stale.exists()  # the pods forgot the earlier job's cause when they started
        assert json.loads((run / "spec.json").read_text())["placement"]["target"] == "eks"
        assert (run / "logs" / "e2e-worker-0").is_dir() and (run / "logs" / "e2e-worker-1").is_dir()
        events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
        assert any(e["event"] == "resume" for e in events)  # the group re-formed after the loss

        # The agents leave together (torchrun's exit barrier); the first pod the operator saw finish ended
        # the job and one still running then was deleted (v1.9.4's rule): which one is a race.
        assert len(fake.deleted) <= 2 and {p.phase for p in fake.pods.values()} == {"Succeeded"}
        leader = invoke("logs", "--run-id", "e2e")
        assert leader.returncode == 0, leader.stderr
        if leader_pod(fake, "e2e") in fake.deleted:
            assert "holds group rank 0 now" in leader.stdout and "runs/e2e/logs/" in leader.stdout
        else:
            assert leader.stdout.startswith("==> e2e-worker-") and "(leader)" in leader.stdout.splitlines()[0]
            assert "group_rank=0" in leader.stdout and "summary: runs/e2e/summary.json" in leader.stdout
            follow = invoke("logs", "--run-id", "e2e", "-f")  # the pod has ended, so follow returns
            assert follow.returncode == 0 and "summary: runs/e2e/summary.json" in follow.stdout

        # the pods met over TLS, as the job's identity: the one the issuer gave this job, with its rendezvous id
        (granted,) = [line for line in etcd.log if line.startswith("etcd issuer: job e2e: identity for rendezvous")]
        rdzv_id = job["spec"]["elasticPolicy"]["rdzvId"]
        assert f"rendezvous {rdzv_id}," in granted and "etcd" in submitted.stdout
        stopped = invoke("stop", "--run-id", "e2e")
        assert stopped.returncode == 0 and "deleted job trainkit-jobs/e2e" in stopped.stdout
        assert ("trainkit-jobs", "e2e") not in fake.jobs and (run / "summary.json").exists()  # outputs stay
        assert invoke("status", "--run-id", "e2e").returncode == 2
        # the job is gone: so is its identity, and the rendezvous keys it held
        uid = job["metadata"]["uid"]
        fake.wait(
            lambda: f"etcd issuer: revoked trainkit-job-{uid} (its job ended or is gone)" in etcd.log, 10, "revoke"
        )
        assert etcd.issuer.auth.request("GET", f"/v2/keys/torch/elastic/store/{rdzv_id}")[0] == 404


def test_a_frozen_rank_is_restarted_and_no_pod_leaves_before_the_run_is_published(fake, tmp_path):
    """Rank 1 freezes (SIGSTOP) in step 6: its pod's watchdog finds it stopped, the other pod's finds its rank waiting
    in a collective for a peer on another node; both restart from the step-4 checkpoint in place (the pods stay).
    Then v1.9.4 marks the job Succeeded when the first Worker pod succeeds and deletes the pods still running
    (cleanPodPolicy Running). Rank 0 is made slow to publish (3 s, far more than the ranks drift apart at the end):
    the other node's ranks wait for it at the final barrier, so the summary, the exported model and the finish event
    are all there.
    Beside it (sharing the processes' start-up), the same job with `--max-restarts 0` fails with the stall's cause,
    and none of its pods' processes is left."""
    fake.pod_env["TRAINKIT_TEST_PUBLISH_DELAY_S"] = "3"
    fake.pod_env[HANG_ENV] = "sigstop@1:6"  # every pod: each run's rank 1 freezes once (a marker in its folder)
    stall = ("--checkpoint-interval", "4", "--stall-timeout", "6")
    with EtcdServer(tmp_path / "etcd") as etcd:
        submitted = invoke("train", *job_flags(fake.reach(etcd.endpoint), "slow", 8, *stall))
        assert submitted.returncode == 0, submitted.stderr
        submitted = invoke("train", *job_flags(fake.reach(etcd.endpoint), "frozen", 8, *stall, "--max-restarts", "0"))
        assert submitted.returncode == 0, submitted.stderr
        frozen = fake.jobs[("trainkit-jobs", "frozen")]

        # --max-restarts 0: torchrun has no restart left, the pods exit 1 (permanent), the operator fails the job and
        # deletes the pods still running. The cause is the node's whose rank froze, whichever pod ended first.
        fake.wait(lambda: frozen["status"]["conditions"][-1]["type"] == "Failed", 120, "the frozen job to fail")
        status = invoke("status", "--run-id", "frozen")
        assert status.returncode == 0 and "frozen (run frozen): failed (Failed)" in status.stdout, status.stderr
        cause = next((line for line in status.stdout.splitlines() if line.startswith("  cause ")), status.stdout)
        assert "stalled: rank " in cause and "after step 5" in cause, status.stdout
        assert "did not arrive: rank 1 stopped by a signal" in cause, status.stdout
        events_file = fake.fsx / "runs" / "frozen" / "events.jsonl"
        records = [json.loads(line) for line in events_file.read_text().splitlines()]
        stalled = [record for record in records if record["event"] == "stalled"]
        assert stalled and not any(record["restart"] for record in stalled), stalled
        assert "resume" not in [record["event"] for record in records]
        fake.wait(lambda: not processes_with("POD_NAME=frozen-worker-"), 30, "every process of the frozen pods gone")

        job = fake.jobs[("trainkit-jobs", "slow")]
        fake.wait(lambda: job["status"]["conditions"][-1]["type"] == "Succeeded", 240, "the job to succeed")
        run = fake.fsx / "runs" / "slow"
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps"] == 8 and summary["world_size"] == 2
        records = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
        events = [record["event"] for record in records]
        assert events[-1] == "finish" and events.count("stalled") >= 1, events
        # Each node's watchdog sees its own rank: the frozen one stopped, the other waiting in a collective for a
        # peer elsewhere. Whichever fires first restarts the job; the other node's agent then joins the new round.
        seen = {rank: e["ranks"][rank]["doing"] for e in records if e["event"] == "stalled" for rank in e["ranks"]}
        assert seen and seen.get("1", "stopped by a signal") == "stopped by a signal", records
        assert seen.get("0", "waiting in a collective").startswith(("waiting in a collective", "exited")), records
        assert [e["step"] for e in records if e["event"] == "resume"] == [4]
        model = run / "model"
        assert (model / "config.json").exists() and list(model.glob("*.safetensors"))
        assert (run / "checkpoints" / "latest").read_text().strip() == "step-00000008"
        # Rank 1 (the other node: whichever pod did not hold group rank 0) waited for rank 0 at the final barrier
        # before it left.
        other = ({"slow-worker-0", "slow-worker-1"} - {leader_pod(fake, "slow")}).pop()
        log = max((run / "logs" / other).rglob("stdout.log"), key=lambda path: path.stat().st_mtime)  # last attempt
        assert "rank 1: run published by rank 0, leaving" in log.read_text()
        assert log.stat().st_mtime >= (run / "summary.json").stat().st_mtime
        # Had the operator deleted the leader's pod (the one still running when another finished), `invoke
        # logs` says so and where the logs are, rather than showing another pod as the leader.
        with fake.lock:
            fake.pods.pop(("trainkit-jobs", leader_pod(fake, "slow")), None)
            left = [name for _, name in fake.pods if name.startswith("slow-")]
        logs = invoke("logs", "--run-id", "slow")
        if left:
            assert logs.returncode == 0, logs.stderr
            assert "holds group rank 0 now" in logs.stdout and "runs/slow/logs/" in logs.stdout
            assert "(leader)" not in logs.stdout
        else:  # the operator had deleted the other one
            assert logs.returncode == 2 and "has ended and its pods are gone" in logs.stderr
        with fake.lock:
            fake.pods.clear()
        gone = invoke("logs", "--run-id", "slow")
        assert gone.returncode == 2 and "runs/slow/logs/" in gone.stderr and "Traceback" not in gone.stderr
