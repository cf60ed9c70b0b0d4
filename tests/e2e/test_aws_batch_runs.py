"""Batch multi-node jobs run on the stand-in (tests/helpers/batch_standin.py): the jobs as `invoke train --target
batch` submits them, each node's entry point as local processes with the Batch variables, the run folder on one
shared folder standing for FSx, the states, attempts, node jobs and CloudWatch streams as Batch makes them.

One test runs three 2-node bert-tiny jobs at once (most of a job's time here is processes starting, which they
share): one undisturbed, one whose child node's instance is lost after the first checkpoint, and one stopped with
`invoke stop` as soon as it runs (the run's own stop at a step boundary is tests/e2e/test_local_control.py's).
BERT trains with the recipe's sharding, whatever it is."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers.batch_moto import P_QUOTA, batch_account
from tests.helpers.product import invoke_in, read_jsonl
from tests.helpers.waiting import latest_step, wait_for

JOB = ("--model", "bert-tiny", "--nodes", "2", "--nproc", "1", "--seq-len", "32", "--checkpoint-interval", "4")


@pytest.fixture
def account(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))
    with batch_account(tmp_path, quotas={P_QUOTA["code"]: 4 * 192}, run_jobs=True) as found:
        for name, value in found.env.items():
            monkeypatch.setenv(name, value)
        yield found


def submit(folder, account, run_id: str, *flags: str) -> str:
    done = invoke_in(folder, "train", "--target", "batch", "--image", account.image, "--run-id", run_id, *flags)
    assert done.returncode == 0, done.stderr
    return re.search(r"submitted Batch job \S+ \(id (\S+), run ", done.stdout)[1]


def losses(run_dir) -> dict[int, str]:
    """Loss per step as the progress line prints it; a step trained again after a resume counts once, last."""
    return {r["step"]: f"{r['loss']:.4f}" for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r}


def test_two_node_jobs_complete_resume_after_a_lost_node_and_stop(tmp_path, account):
    runs = account.service.fsx / "runs"
    reference = submit(tmp_path, account, "ref", *JOB, "--steps", "24")
    lost = submit(tmp_path, account, "lost", *JOB, "--steps", "24")
    stopped = submit(tmp_path, account, "stp", *JOB, "--steps", "400")
    batch = account.client("batch")
    wait_for(lambda: batch.describe_jobs(jobs=[stopped])["jobs"][0]["status"] == "RUNNING", 120, "stp running")

    # After the first checkpoint reached FSx, the child node's instance goes away. Batch does nothing to the main
    # node; its workers lose their peer, it exits EXIT_REPLACE, and the retry strategy starts a second attempt.
    wait_for(lambda: latest_step(runs / "lost") >= 4, 300, "the lost run's first checkpoint")
    account.service.jobs[lost].fail_host(1)
    said = invoke_in(tmp_path, "stop", "--run-id", "stp")  # once it runs: its containers get SIGTERM
    assert said.returncode == 0 and "stopping Batch job stp-" in said.stdout, said.stderr

    done = account.wait(reference, timeout=300)
    assert done["status"] == "SUCCEEDED" and len(done["attempts"]) == 1, done
    summary = json.loads((runs / "ref" / "summary.json").read_text())
    assert summary["steps"] == 24 and summary["world_size"] == 2, summary

    done = account.wait(lost, timeout=300)
    assert done["status"] == "SUCCEEDED", done
    first, second = done["attempts"]
    assert first["container"]["exitCode"] == 192 and second["container"]["exitCode"] == 0, done["attempts"]
    (child,) = batch.describe_jobs(jobs=[f"{lost}#1"])["jobs"]
    assert child["attempts"][0]["statusReason"].startswith("Host EC2 ("), child["attempts"]
    resumed = [e for e in read_jsonl(runs / "lost" / "events.jsonl") if e["event"] == "resume"]
    assert resumed and resumed[-1]["step"] >= 4, resumed
    reference_losses = losses(runs / "ref")
    assert sorted(reference_losses) == list(range(1, 25))
    assert losses(runs / "lost") == reference_losses

    done = account.wait(stopped, timeout=300)
    assert done["status"] == "FAILED" and done["statusReason"] == "stopped with `invoke stop`", done
    assert len(done["attempts"]) == 1 and done["attempts"][0]["container"]["exitCode"] >= 128  # not retried

    status = invoke_in(tmp_path, "status", "--run-id", "lost")
    assert status.returncode == 0, status.stderr
    text = status.stdout
    assert "status SUCCEEDED, 2 x p5.48xlarge, attempt 2 of 4" in text, text
    assert "  attempt 1: " in text and "exit 192" in text and "node 1 SUCCEEDED, exit 0" in text, text
    assert "run folder /fsx/runs/lost (FSx)" in text, text
    rank1 = invoke_in(tmp_path, "logs", "--run-id", "ref", "--rank", "1")
    assert rank1.returncode == 0, rank1.stderr
    lines = rank1.stdout.splitlines()
    assert re.fullmatch(r"==> ref-\S+/node-[01] \(rank 1\)", lines[0]), lines[0]
    assert len(lines) > 1 and all(line.startswith("[default0]:") for line in lines[1:]), lines
    leader = invoke_in(tmp_path, "logs", "--run-id", "ref")  # the node of rank 0, wherever the rendezvous put it
    assert leader.stdout.startswith("==> ref-") and "(leader)" in leader.stdout.splitlines()[0], leader.stdout
    assert "ref step 24/24 (100%)" in leader.stdout, leader.stdout[-2000:]
