"""The test API server ends jobs as training-operator v1.9.4 does (tests/helpers/kube_api.py cites the
source): pods here run a shell command instead of training, so each rule is seen on its own."""

from __future__ import annotations

import time
from datetime import datetime

from tests.helpers.eks import IMAGE, container, job_for, worker
from trainkit.backends.eks.backend import status
from trainkit.run.state import RunState

NAMESPACE = "trainkit-jobs"


def submit(fake, name: str, script: str, restart_policy: str | None = None, **spec) -> dict:
    """`script` in every worker; the c10d rendezvous, whose pods need no etcd identity (nor its issuer) to start."""
    flags = {"model": "llama2-tiny", "image": IMAGE, "nodes": "2", "nproc": "1", "run_id": name, "rdzv": "c10d"}
    job = job_for(flags)
    pod = container(job)
    pod["command"], pod["args"] = ["sh", "-c", script], []
    job["spec"]["runPolicy"].update(spec)
    if restart_policy:
        worker(job)["restartPolicy"] = restart_policy
    code, body = fake.create_job(NAMESPACE, job)
    assert code == 201, body
    return fake.jobs[(NAMESPACE, job["metadata"]["name"])]


def kinds(job: dict) -> list[tuple[str, str]]:
    return [(c["type"], c["status"]) for c in job["status"]["conditions"]]


def test_the_first_worker_to_succeed_ends_the_job_and_the_running_ones_are_deleted(fake):
    # worker-0 finishes after a second; worker-1 would run for a minute and records the SIGTERM it gets.
    script = 'case "$POD_NAME" in *-0) sleep 1; exit 0;; *) trap "echo TERM; exit 143" TERM; sleep 60 & wait;; esac'
    job = submit(fake, "early", script)
    name = job["metadata"]["name"]
    fake.wait(lambda: kinds(job)[-1] == ("Succeeded", "True"), 30, "the job to succeed")
    assert kinds(job) == [("Created", "True"), ("Running", "False"), ("Succeeded", "True")]
    assert [c["reason"] for c in job["status"]["conditions"]] == [
        "PyTorchJobCreated",
        "PyTorchJobRunning",
        "PyTorchJobSucceeded",
    ]
    assert job["status"]["conditions"][-1]["message"] == f"PyTorchJob {NAMESPACE}/{name} successfully completed."
    assert fake.deleted == [f"{name}-worker-1"]  # cleanPodPolicy Running: the finished pod stays
    assert fake.pod(f"{name}-worker-0").phase == "Succeeded"
    fake.wait(lambda: "TERM" in (fake.root / f"{name}-worker-1.log").read_text(), 10, "SIGTERM to worker-1")


def test_restarts_in_place_until_the_backoff_limit_fails_the_job(fake):
    job = submit(fake, "crash", "sleep 0.3; exit 1", restart_policy="OnFailure", backoffLimit=4)
    name = job["metadata"]["name"]
    fake.wait(lambda: kinds(job)[-1] == ("Failed", "True"), 60, "the job to fail")
    failed = job["status"]["conditions"][-1]
    assert failed["reason"] == "PyTorchJobFailed"
    assert failed["message"] == f"Job {name} has failed because it has reached the specified backoff limit"
    assert "Restarting" not in [kind for kind, _ in kinds(job)]  # containers restarted in place
    assert sorted(fake.deleted) == [f"{name}-worker-0", f"{name}-worker-1"]
    # Failed is final: nothing the pods do afterwards changes the conditions.
    before = list(job["status"]["conditions"])
    time.sleep(1)  # five kubelet rounds
    assert job["status"]["conditions"] == before


def test_a_job_the_webhook_refuses_creates_nothing(fake):
    job = job_for({"model": "llama2-tiny", "image": IMAGE, "nodes": "2", "nproc": "1", "run_id": "refused"})
    container(job)["name"] = "trainer"
    code, body = fake.create_job(NAMESPACE, job)
    assert code == 400 and "must have at least one container with name pytorch" in body["message"]
    assert not fake.jobs and not fake.pods


def test_exit_code_policy_replaces_a_pod_that_exits_128_or_more(fake):
    # worker-0's first container run is killed (137); its replacement, a new pod of the same name, finishes.
    script = 'case "$POD_NAME" in *-0) [ -e once ] || { touch once; exit 137; }; sleep 1; exit 0;; *) sleep 60;; esac'
    job = submit(fake, "retry", script)
    name = job["metadata"]["name"]
    assert worker(job)["restartPolicy"] == "ExitCode"  # what training jobs are rendered with
    fake.wait(lambda: "Restarting" in [kind for kind, _ in kinds(job)], 30, "the Restarting condition")
    restarting = next(c for c in job["status"]["conditions"] if c["type"] == "Restarting")
    assert restarting["message"] == f"PyTorchJob {name} is restarting because 1 Worker replica(s) failed."
    fake.wait(lambda: kinds(job)[-1] == ("Succeeded", "True"), 30, "the replacement pod to finish")
    assert fake.deleted[0] == f"{name}-worker-0"  # the failed pod, deleted to be created again
    replacement = fake.pod(f"{name}-worker-0")
    assert replacement.phase == "Succeeded" and replacement.restarts == 0  # a new pod, not an in-place restart
    assert replacement.manifest["spec"]["restartPolicy"] == "Never"  # SetRestartPolicy: ExitCode -> Never


def test_exit_code_policy_fails_the_job_on_1_to_127_and_status_says_why(fake):
    line = "retry-worker-0: rank 0: OSError: [Errno 28] No space left on device while writing checkpoint step-8"
    script = f'case "$POD_NAME" in *-0) echo "{line}" > "$TRAINKIT_TERMINATION_LOG"; exit 3;; *) sleep 60;; esac'
    job = submit(fake, "perm", script)
    name = job["metadata"]["name"]
    fake.wait(lambda: kinds(job)[-1] == ("Failed", "True"), 30, "the job to fail")
    failed = job["status"]["conditions"][-1]
    assert failed["reason"] == "PyTorchJobFailed"
    assert failed["message"] == f'job "{name}" is failing because "Worker" replica(s) failed.'
    assert "Restarting" not in [kind for kind, _ in kinds(job)]
    pod = fake.pod(f"{name}-worker-0")
    assert pod.phase == "Failed" and pod.to_api()["status"]["containerStatuses"][0]["state"]["terminated"] == {
        **pod.terminated,
        "exitCode": 3,
        "reason": "Error",
        "message": line + "\n",
    }
    assert fake.deleted == [f"{name}-worker-1"]  # cleanPodPolicy Running: the running one goes, the failed one stays
    found = status("trainkit-jobs", name)
    shown = found.text
    assert found.state is RunState.FAILED
    assert shown.startswith(f"job trainkit-jobs/{name} (run perm): failed (Failed)") and f"  cause      {line}" in shown


def test_an_empty_termination_message_falls_back_to_the_log_tail(fake):
    crash = 'echo starting; echo "ImportError: no module named flash_attn"; exit 1'
    script = f'case "$POD_NAME" in *-0) {crash};; *) sleep 60;; esac'
    job = submit(fake, "tail", script)
    fake.wait(lambda: kinds(job)[-1] == ("Failed", "True"), 30, "the job to fail")
    message = fake.pod(f"{job['metadata']['name']}-worker-0").terminated["message"]
    assert message == "starting\nImportError: no module named flash_attn\n"  # FallbackToLogsOnError
    assert "  cause      ImportError: no module named flash_attn" in status("trainkit-jobs", "tail").text


def test_the_active_deadline_fails_the_job_and_deletes_its_pods_and_status_says_so(fake):
    # Both workers would run a minute; each records the SIGTERM its deletion sends.
    job = submit(fake, "late", 'trap "echo TERM; exit 143" TERM; sleep 60 & wait', activeDeadlineSeconds=2)
    name = job["metadata"]["name"]
    fake.wait(lambda: kinds(job)[-1] == ("Failed", "True"), 30, "the job to fail")
    assert kinds(job) == [("Created", "True"), ("Running", "False"), ("Failed", "True")]
    failed = job["status"]["conditions"][-1]
    assert failed["reason"] == "PyTorchJobFailed"
    assert failed["message"] == f"Job {name} has failed because it was active longer than specified deadline"
    started, ended = (datetime.fromisoformat(job["status"][key]) for key in ("startTime", "completionTime"))
    assert (ended - started).total_seconds() >= 2
    assert sorted(fake.deleted) == [f"{name}-worker-0", f"{name}-worker-1"]  # Running pods go, as at any finish
    for index in range(2):
        log = fake.root / f"{name}-worker-{index}.log"
        fake.wait(lambda log=log: "TERM" in log.read_text(), 10, f"SIGTERM to worker-{index}")
    shown = status(NAMESPACE, "late").text
    assert shown.startswith(f"job {NAMESPACE}/{name} (run late): failed (Failed)") and "  (no pods left)" in shown
    assert "  cause      stopped at its --max-runtime deadline (2 s from the job's start" in shown
    assert "submit again with --run-id late to resume with a fresh window" in shown
