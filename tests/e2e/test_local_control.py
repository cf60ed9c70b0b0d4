"""`invoke status | logs | stop` on a local run, read from its run folder while a real 2-process job runs; and what
the machine's other users can reach of it (its rendezvous store and id) meanwhile."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.helpers.containers import processes_with
from tests.helpers.product import invoke, output, read_jsonl, start_invoke, tiny_args
from tests.helpers.sockets import command_lines_with, listening_addresses
from tests.helpers.waiting import latest_step, wait_for
from trainkit.backends.local.deadline import EXIT_DEADLINE
from trainkit.run.torchrun import RDZV_ID_ENV


def test_status_logs_stop_of_a_running_local_job_and_another_stopped_by_its_deadline(tmp_path):
    """Two runs at once: one under a 22 s deadline (checked at the end), one stopped with `invoke stop` once it
    trains (most of the deadline's time is waiting: the machine has room for both)."""
    deadline_runs = tmp_path / "deadline-runs"
    flags = ("--steps", "2000", "--checkpoint-interval", "3", "--max-runtime", "22", "--run-id", "dl")
    began = time.time()
    bounded = start_invoke(*tiny_args(deadline_runs, *flags))
    runs = tmp_path / "runs"
    where = ["--runs-dir", str(runs)]
    job = start_invoke("train", *where, "--steps", "400", "--metrics-port", "0", "--run-id", "ctl")
    metrics = runs / "ctl" / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, 180, "3 training steps")
    check_private_rendezvous(runs / "ctl")

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

    check_deadline(bounded, deadline_runs, began)


def check_private_rendezvous(run_dir: Path) -> None:
    """The run's c10d store listens on 127.0.0.1 only, and its rendezvous id, which torchrun took from the agent's
    environment (it names the agent's log folder by it), is on no process's command line, which every user of the
    machine can read."""
    agent = int((run_dir / "launcher.pid").read_text().split()[0])
    words = Path(f"/proc/{agent}/cmdline").read_bytes().decode().split("\0")
    port = int(words[words.index("--rdzv-endpoint") + 1].rpartition(":")[2])
    assert listening_addresses(port) == {"127.0.0.1"}
    environ = dict(e.split("=", 1) for e in Path(f"/proc/{agent}/environ").read_text().split("\0") if "=" in e)
    rdzv_id = environ[RDZV_ID_ENV]
    assert rdzv_id.startswith("ctl-") and any(p.name.startswith(f"{rdzv_id}_") for p in (run_dir / "logs").iterdir())
    assert command_lines_with(rdzv_id) == []


def run_processes(run_dir: Path) -> list[int]:
    """The processes of a run on this machine: its torchrun agents and their workers, whose environment names the
    run folder (the launcher's own does not)."""
    return processes_with(f"TRAINKIT_RUN_DIR={run_dir}")


def check_deadline(process, runs: Path, began: float) -> None:
    """A run of 2000 steps under a 22 s deadline: stopped as Ctrl-C stops it, failed with exit 124 and one line."""
    assert process.wait(timeout=180) == EXIT_DEADLINE, output(process)[-3000:]
    run_dir = runs / "dl"
    events = read_jsonl(run_dir / "events.jsonl")
    stop, deadline = [e for e in events if e["event"] == "stop"][-1], events[-1]
    assert deadline["event"] == "deadline" and deadline["source"] == "launcher", events[-3:]
    assert [e["event"] for e in events].count("checkpoint") >= 2, "the run must get going before its deadline"
    step = stop["step"]
    assert deadline["max_runtime"] == 22 and deadline["step"] == step and deadline["checkpoint"] == latest_step(run_dir)
    if stop["checkpoint"] is not None:  # the grace allowed a checkpoint at the step it stopped at
        assert stop["checkpoint"] == step == latest_step(run_dir)
        kept = f"checkpoint at step {step} saved; the same command resumes it with a fresh 22 s window"
    else:
        kept = f"its last checkpoint is at step {latest_step(run_dir)} (no time to save another)"
    reason = f"run dl stopped at its --max-runtime deadline (22 s) at step {step}; {kept}"
    last = output(process).strip().splitlines()[-1]
    assert last.startswith(f"error: {reason}"), output(process)[-2000:]
    assert 22 < deadline["time"] - began < 22 + 40 + 30  # the deadline, the stop's grace at most, the launcher's start

    failure = json.loads((run_dir / "failure.json").read_text())
    assert failure["line"] == last.removeprefix("error: ") and failure["exit_code"] == EXIT_DEADLINE
    status = invoke("status", "--runs-dir", str(runs))
    lines = status.stdout.splitlines()
    assert lines[0] == "run dl (llama2-tiny, 1 node(s) x 2 process(es)): failed", status.stdout
    assert f"  cause      {failure['line']}" in lines and any("fresh --max-runtime window" in x for x in lines)
    wait_for(lambda: not run_processes(run_dir), 5, "every agent and worker of the run to be gone")
    assert not (run_dir / "launcher.pid").exists() and not (run_dir / "launcher.json").exists()
