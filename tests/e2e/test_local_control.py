"""`invoke status | logs | stop` on a local run, read from its run folder while a real 2-process job runs."""

from __future__ import annotations

import json

from tests.helpers.product import invoke, output, read_jsonl, start_invoke
from tests.helpers.waiting import wait_for


def test_status_logs_stop_of_a_running_local_job(tmp_path):
    runs = tmp_path / "runs"
    where = ["--runs-dir", str(runs)]
    job = start_invoke("train", *where, "--steps", "400", "--metrics-port", "0", "--run-id", "ctl")
    metrics = runs / "ctl" / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, 180, "3 training steps")

    status = invoke("status", *where)  # no --run-id: the newest run there
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == "run ctl (llama2-tiny, 1 node(s) x 2 process(es)): running"
    assert any(line.split()[0] == "step" and "of 400, loss" in line for line in lines[1:]), status.stdout

    stopped = invoke("stop", *where, "--run-id", "ctl")
    assert stopped.returncode == 0 and "asked run ctl to stop" in stopped.stdout
    assert job.wait(timeout=90) == 128 + 15, output(job)  # stopped as Ctrl-C stops it: SIGTERM
    events = read_jsonl(runs / "ctl" / "events.jsonl")
    assert events[-1]["event"] == "stop" and events[-1]["checkpoint"] == events[-1]["step"]

    rank1 = invoke("logs", *where, "--run-id", "ctl", "--rank", "1")
    assert rank1.returncode == 0, rank1.stderr
    assert rank1.stdout.startswith("==> ctl (rank 1)\n")
    assert "rank 1: stopping at step" in rank1.stdout and "rank 0: stopping" not in rank1.stdout
    leader = invoke("logs", *where)
    assert leader.stdout.splitlines()[0] == "==> ctl (rank 0) (leader)"
    assert "rank 0: stopping at step" in leader.stdout and "ctl step 1/400" in leader.stdout  # its progress
    files = json.loads((runs / "ctl" / "logs" / "ranks" / "1.json").read_text())
    assert set(files) == {"stdout", "stderr"}

    after = invoke("status", *where, "--run-id", "ctl")
    assert after.stdout.splitlines()[0].endswith(": stopped")
    again = invoke("stop", *where, "--run-id", "ctl")
    assert again.returncode == 2 and "is not running on this machine" in again.stderr
    missing = invoke("logs", *where, "--run-id", "nope", "--target", "local")  # without it: EKS is asked
    assert missing.returncode == 2 and "no run in" in missing.stderr and "runs there: ctl" in missing.stderr
