"""Batch multi-node jobs run on the stand-in (tests/helpers/batch_standin.py): the jobs as `invoke train --target
batch` submits them, each node's entry point as local processes with the Batch variables, the run folder on one
shared folder standing for FSx, the states, attempts, node jobs and CloudWatch streams as Batch makes them.

One test runs four 2-node bert-tiny jobs at once (most of a job's time here is processes starting, which they
share): one undisturbed; one whose rank 1 hangs in a step (training/common/faults.py), which the nodes' stall
watchdogs end and the retry strategy restarts from the checkpoint; one whose child node's instance is lost after
the first checkpoint and whose rank 1 then freezes with no attempt left, which fails the job with the stall's cause;
and one stopped with `invoke stop` as soon as it runs (the run's own stop at a step boundary is
tests/e2e/test_local_control.py's). BERT trains with the recipe's sharding, whatever it is."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers.batch_moto import P_QUOTA, batch_account
from tests.helpers.containers import processes_with
from tests.helpers.product import invoke_in, read_jsonl
from tests.helpers.tiny_decoders import write_pretrained
from tests.helpers.tracked import steps_of, tracked_runs
from tests.helpers.waiting import latest_step, wait_for
from training.common.faults import HANG_ENV, RELEASE_FILE

JOB = ("--model", "bert-tiny", "--nodes", "2", "--nproc", "1", "--seq-len", "32", "--checkpoint-interval", "4")
JOB += ("--eval-fraction", "0.1")  # evaluated at each checkpoint: `invoke status` shows the last one
# No evaluation improves by 100: patience 1 stops a run at its second evaluation, step 8 (a normal end).
EARLY = ("--early-stop-patience", "1", "--early-stop-delta", "100")


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


def events(run_dir, kind: str) -> list[dict]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == kind]


def test_two_node_jobs_complete_resume_after_a_stall_or_a_lost_node_and_stop(tmp_path, account, gated_mlflow):
    runs = account.service.fsx / "runs"
    # Rank 1 of run stl sleeps in step 6 (outside any collective). Run lost's ranks wait in the save after step 8 until
    # the test has failed a host and lets them go; in the second attempt its rank 1 freezes (SIGSTOP) in step 10
    # (each fault strikes once in a run). The longest jobs first: each submission takes seconds.
    gate = "hold@0:8,hold@1:8"
    account.service.run_env |= {"stl": {HANG_ENV: "sleep@1:6"}, "lost": {HANG_ENV: f"{gate},sigstop@1:10"}}
    # A bert-tiny step takes well under a second here, even with the four jobs starting at once.
    stall = ("--stall-timeout", "3")
    lost = submit(tmp_path, account, "lost", *JOB, "--steps", "16", *stall, "--max-restarts", "1")
    hung = submit(tmp_path, account, "stl", *JOB, "--steps", "16", *stall, *EARLY)
    reference = submit(tmp_path, account, "ref", *JOB, "--steps", "16", *EARLY)
    stopped = submit(tmp_path, account, "stp", *JOB, "--steps", "400")
    batch = account.client("batch")
    wait_for(lambda: batch.describe_jobs(jobs=[stopped])["jobs"][0]["status"] == "RUNNING", 120, "stp running")
    # Stopped at once: its processes starting up would only slow the other jobs' start.
    said = invoke_in(tmp_path, "stop", "--run-id", "stp")  # once it runs: its containers get SIGTERM
    assert said.returncode == 0 and "stopping Batch job stp-" in said.stdout, said.stderr

    # With the step-4 checkpoint on FSx and both ranks held in the next save, the child node's instance goes away.
    # Batch does nothing to the main node; once let go, its rank finds its peer gone, the node exits EXIT_REPLACE, and
    # the retry strategy starts a second attempt.
    markers = runs / "lost" / ".test-faults"
    wait_for(lambda: all((markers / held).exists() for held in gate.split(",")), 300, "the lost run held at step 8")
    assert latest_step(runs / "lost") == 4
    account.service.jobs[lost].fail_host(1)
    wait_for(lambda: not processes_with(f"AWS_BATCH_JOB_ID={lost}#1"), 30, "the lost host's processes gone")
    (markers / RELEASE_FILE).touch()

    done = account.wait(reference, timeout=300)
    assert done["status"] == "SUCCEEDED" and len(done["attempts"]) == 1, done
    summary = json.loads((runs / "ref" / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["world_size"] == 2 and summary["stopped_early"]["step"] == 8, summary
    reference_losses = losses(runs / "ref")
    assert sorted(reference_losses) == list(range(1, 9))

    # The stall: each node's watchdog ends its ranks, the main node exits EXIT_REPLACE (192), and the retry strategy
    # starts a second attempt, which resumes from the step-4 checkpoint on FSx and finishes (stopping early at 8).
    done = account.wait(hung, timeout=300)
    assert done["status"] == "SUCCEEDED", done
    first, second = done["attempts"]
    assert first["container"]["exitCode"] == 192 and second["container"]["exitCode"] == 0, done["attempts"]
    run = runs / "stl"
    assert [e["step"] for e in events(run, "resume")] == [4]
    assert losses(run) == reference_losses
    # The node whose rank hung names it (the other node's rank waited in a collective for it): rank 1, in the hook's
    # sleep after step 5. Its stacks went into its log: the hook, called from the training step.
    stalls = events(run, "stalled")
    culprits = [e for e in stalls if 1 in e["not_arrived"]]
    assert len(culprits) == 1, stalls  # each node's finding, whole, if not
    (culprit,) = culprits
    assert culprit["step"] == 5 and culprit["not_arrived"] == [1] and culprit["allowance"] == "--stall-timeout"
    assert culprit["restart"]  # by the retry strategy's next attempt: torchrun restarts nobody inside one
    assert re.fullmatch(r"not in a collective: .*faults\.py:\d+ in hang_here", culprit["ranks"]["1"]["doing"])
    dumps = [log.read_text() for log in (run / "logs").rglob("attempt_0/0/stderr.log")]
    assert any(re.search(r'in hang_here\n  File ".*/training/\S+", line \d+ in ', text) for text in dumps), dumps
    status = invoke_in(tmp_path, "status", "--run-id", "stl")
    assert status.returncode == 0, status.stderr
    text = status.stdout
    assert "status SUCCEEDED, 2 x p5.48xlarge, attempt 2 of 4" in text, text
    assert "  attempt 1: " in text and "exit 192" in text and "node 1 SUCCEEDED, exit 0" in text, text
    assert "run folder /fsx/runs/stl (FSx)" in text, text
    last_eval = [r for r in read_jsonl(run / "metrics.jsonl") if "eval_loss" in r][-1]
    assert f"  eval at step 8: eval_loss={last_eval['eval_loss']:.4f}" in text, text
    best = json.loads((run / "summary.json").read_text())["stopped_early"]["best_step"]
    assert text.startswith("Batch job stl-") and f": finished: stopped early at step 8, best at step {best}\n" in text

    # The lost host's attempt is retried; the second attempt resumes from the step-4 checkpoint, its rank 1 freezes,
    # and with no attempt left (--max-restarts 1) the job fails with the stall's cause, not retried.
    done = account.wait(lost, timeout=300)
    assert done["status"] == "FAILED" and done["statusReason"] == "Essential container in task exited", done
    assert [a["container"]["exitCode"] for a in done["attempts"]] == [192, 192], done["attempts"]
    (child,) = batch.describe_jobs(jobs=[f"{lost}#1"])["jobs"]
    assert child["attempts"][0]["statusReason"].startswith("Host EC2 ("), child["attempts"]
    run = runs / "lost"
    assert [e["step"] for e in events(run, "resume")] == [4]
    assert {step: losses(run)[step] for step in range(1, 9)} == reference_losses
    stalls = events(run, "stalled")
    culprits = [e for e in stalls if 1 in e["not_arrived"]]
    assert len(culprits) == 1, stalls
    (culprit,) = culprits
    assert culprit["step"] == 9 and culprit["ranks"]["1"]["doing"] == "stopped by a signal", culprit
    assert not culprit["restart"], culprit  # the last attempt
    text = invoke_in(tmp_path, "status", "--run-id", "lost").stdout
    assert "status FAILED, 2 x p5.48xlarge, attempt 2 of 2" in text, text
    cause = next((line for line in text.splitlines() if line.startswith("  cause: ")), text)
    assert " exit 192 (no attempt left: the job ends): " in cause and ": stalled: rank " in cause, text
    assert " after step 9 " in cause, text
    assert "did not arrive: rank 1 stopped by a signal" in cause, text
    wait_for(lambda: not processes_with(f"AWS_BATCH_JOB_ID={lost}#"), 30, "every process of the lost job gone")

    done = account.wait(stopped, timeout=300)
    assert done["status"] == "FAILED" and done["statusReason"] == "stopped with `invoke stop`", done
    assert len(done["attempts"]) == 1 and done["attempts"][0]["container"]["exitCode"] >= 128  # not retried

    rank1 = invoke_in(tmp_path, "logs", "--run-id", "ref", "--rank", "1")
    assert rank1.returncode == 0, rank1.stderr
    lines = rank1.stdout.splitlines()
    assert re.fullmatch(r"==> ref-\S+/node-[01] \(rank 1\)", lines[0]), lines[0]
    assert len(lines) > 1 and all(line.startswith("[default0]:") for line in lines[1:]), lines
    leader = invoke_in(tmp_path, "logs", "--run-id", "ref")  # the node of rank 0, wherever the rendezvous put it
    assert leader.stdout.startswith("==> ref-") and "(leader)" in leader.stdout.splitlines()[0], leader.stdout
    assert "ref step 8/16 (50%)" in leader.stdout and "stopped early at step 8: " in leader.stdout, leader.stdout[
        -2000:
    ]

    # A LoRA fine-tune (issue 53) of a model folder on FSx, on two nodes under DDP (NO_SHARD: the strategy the
    # FSDP2 runs of tests/e2e/test_lora.py do not take): the adapters train, alone in the optimizer, the checkpoint
    # holds them alone (adapters/), and the export is PEFT's adapter folder.
    write_pretrained(account.service.fsx / "base", "llama2-tiny", seed=2)
    lora = ("--model", "llama2-tiny", "--nodes", "2", "--nproc", "1", "--steps", "4", "--sharding", "NO_SHARD")
    # tracked to an MLflow server the nodes reach (issue 54), which takes only requests with the token that Batch puts
    # into the containers' environment from the stack's secret
    stored = account.client("secretsmanager")
    stored.put_secret_value(SecretId=account.stack["mlflow_token_secret_arn"], SecretString=gated_mlflow.token)
    lora += ("--track", "mlflow", "--tracking-uri", gated_mlflow.url)
    lora += ("--checkpoint-interval", "2", "--init", "pretrained", "--weights", "base", "--lora-rank", "4")
    adapted = submit(tmp_path, account, "lra", *lora)
    done = account.wait(adapted, timeout=300)
    if done["status"] != "SUCCEEDED":  # why, in the failure: the reason and the nodes' logs
        said = invoke_in(tmp_path, "logs", "--run-id", "lra")
        raise AssertionError(
            f"{done['status']}: {done.get('statusReason')}\n{said.stdout[-4000:]}{said.stderr[-1000:]}"
        )
    run = runs / "lra"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["sharding"]["strategy"] == "NO_SHARD", summary["sharding"]
    held = summary["lora"]
    assert held["optimizer_params"] == held["trained_params"] > 0 and held["frozen_in_optimizer"] == 0, held
    client, (tracked,) = tracked_runs(gated_mlflow.upstream, "lra")
    assert tracked.info.status == "FINISHED" and tracked.data.tags["trainkit.target"] == "batch"
    assert steps_of(client, tracked.info.run_id) == [1, 2, 3, 4] and tracked.data.params["lora.rank"] == "4"
    assert sorted(a.path for a in client.list_artifacts(tracked.info.run_id)) == ["report.png", "summary.json"]
    assert (run / "checkpoints" / "step-00000004" / "adapters").is_dir()
    assert json.loads((run / "model" / "adapter_config.json").read_text())["r"] == 4
