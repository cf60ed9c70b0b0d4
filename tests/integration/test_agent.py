"""trainkit's torchrun (trainkit/run/agent.py) with real agents and workers: a worker's "do not retry" exit ends
the group at once, any other failure is restarted as torchrun does, and every failure reaches the launcher's
channel in one record, also from a worker killed by a signal. The workers are small scripts, so each case costs
an agent's start and no training."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers.paths import REPO
from training.common.failure import EXIT_NO_RETRY, NODE_ENV, SEND_TIMEOUT_S, cause_line
from trainkit.run.agent import EXIT_RENDEZVOUS
from trainkit.run.failures import FailureChannel, failure_summary, wait_for_records
from trainkit.run.node import EXIT_REPLACE, node_exit_code

WORKER = """
import errno, os, signal, sys, time
from pathlib import Path
from types import SimpleNamespace

import pytest
from training.common.failure import doing, reported, send

Path(sys.argv[1], f"attempt-{os.environ['TORCHELASTIC_RESTART_COUNT']}").touch()
with reported():
    if sys.argv[2] == "no-space":
        with doing("writing checkpoint step-00000020"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "shard.distcp")
    if sys.argv[2] == "lost-peer":
        raise RuntimeError("Connection closed by peer [127.0.0.1]:29500")
    if sys.argv[2] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[2] == "burst":  # 8 records from every rank, all sent before any rank fails, then all fail
        rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
        for k in range(8):
            assert send({"source": "test", "rank": int(rank), "attempt": int(attempt), "k": k})
        Path(sys.argv[1], f"sent-{attempt}-{rank}").touch()
        while len(list(Path(sys.argv[1]).glob(f"sent-{attempt}-*"))) < int(os.environ["WORLD_SIZE"]):
            time.sleep(0.05)
        raise RuntimeError("Connection closed by peer [127.0.0.1]:29500")
    if sys.argv[2] == "waits":
        Path(sys.argv[1], "started").touch()
        signal.pause()
"""


def agent_command(tmp_path: Path, mode: str, nproc: int = 1, rdzv: tuple[str, ...] = ("--standalone",)) -> list[str]:
    """trainkit's torchrun over WORKER in `mode`: `nproc` workers, 2 restarts allowed."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / mode
    out.mkdir()
    command = [sys.executable, "-m", "trainkit.run.agent", *rdzv, "--nproc-per-node", str(nproc)]
    command += ["--max-restarts", "2", "--monitor-interval", "0.1", "--log-dir", str(tmp_path / "logs"), "--redirects"]
    return [*command, "3", str(script), str(out), mode]


def run_agent(tmp_path: Path, mode: str, nproc: int = 1) -> tuple[int, list[int], FailureChannel]:
    """(exit code, the attempts that ran, the channel with what arrived) of one agent's group."""
    channel = FailureChannel()
    done = subprocess.run(
        agent_command(tmp_path, mode, nproc),
        cwd=REPO,
        env={**channel.env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    wait_for_records(channel)
    out = tmp_path / mode
    attempts = sorted(int(p.name.split("-")[1]) for p in out.glob("attempt-*"))
    assert "Traceback" not in done.stderr.split("torchrun:")[-1], done.stderr[-2000:]  # no ChildFailedError wall
    return done.returncode, attempts, channel


def agent_log(channel: FailureChannel) -> str:
    (log,) = {r["log"] for r in channel.records if r["source"] == "agent"}
    return log


def test_a_failure_no_restart_mends_ends_the_group_at_once(tmp_path):
    """A full volume. Any permanent failure takes this path (the worker's verdict is its exit code; which errors are
    permanent is tests/unit/test_failures.py's; a DataError takes it in a real run in tests/e2e/test_failures.py)."""
    cause = "OSError: [Errno 28] No space left on device: 'shard.distcp' while writing checkpoint step-00000020"
    code, attempts, channel = run_agent(tmp_path, "no-space")
    assert code == EXIT_NO_RETRY and attempts == [0]  # two restarts were allowed, none was spent
    worker = [r for r in channel.records if r["source"] == "worker"]
    agent = [r for r in channel.records if r["source"] == "agent"]
    assert len(worker) == 1 and worker[0]["permanent"] and worker[0]["cause"] == cause
    assert worker[0]["log"] == agent_log(channel)  # the rank named its own log, the file torchrun redirected it to
    assert agent[0]["exit_code"] == EXIT_NO_RETRY and agent[0]["log"].endswith("stderr.log")
    assert channel.cause() is worker[0]
    assert failure_summary(worker[0]).startswith(f"rank 0: {cause}; full log: ")
    assert failure_summary(worker[0]).endswith("(not restarted: a restart would fail the same way)")
    channel.close()


def test_any_other_failure_is_restarted_up_to_max_restarts(tmp_path):
    code, attempts, channel = run_agent(tmp_path, "lost-peer")
    assert code == 1 and attempts == [0, 1, 2]
    worker = [r for r in channel.records if r["source"] == "worker"]
    assert [r["attempt"] for r in worker] == [0, 1, 2] and not any(r["permanent"] for r in worker)
    assert channel.cause()["attempt"] == 2  # the latest attempt's: why the job finally ended
    assert channel.cause()["cause"] == "RuntimeError: Connection closed by peer [127.0.0.1]:29500"
    channel.close()


def test_a_worker_killed_by_a_signal_is_reported_by_its_agent(tmp_path):
    code, attempts, channel = run_agent(tmp_path, "killed")
    assert code == 1 and attempts == [0, 1, 2]  # a signal is not the worker's verdict: restarted
    assert {r["source"] for r in channel.records} == {"agent"}
    cause = channel.cause()
    assert cause["signal"] == "SIGKILL" and cause["attempt"] == 2
    assert cause_line(cause).startswith("rank 0: killed by SIGKILL (the kernel's out-of-memory killer")
    channel.close()


def test_many_ranks_failing_at_once_all_report_and_nobody_waits(tmp_path):
    """Six ranks send 8 records each in each of three attempts while nobody polls: 144 records, far more than the
    10 datagrams Linux queues unread on a Unix socket. None is lost and no sender waits (a sender blocked on a full
    queue holds its rank, and with it the agent's restarts)."""
    started = time.monotonic()
    code, attempts, channel = run_agent(tmp_path, "burst", nproc=6)
    took = time.monotonic() - started
    assert code == 1 and attempts == [0, 1, 2]
    burst = [(r["attempt"], r["rank"], r["k"]) for r in channel.records if r["source"] == "test"]
    assert sorted(burst) == [(a, r, k) for a in range(3) for r in range(6) for k in range(8)]
    assert took < 144 * SEND_TIMEOUT_S / 4  # far less than senders waiting out their timeout would take
    channel.close()


def test_a_rendezvous_that_cannot_be_reached_is_one_line_and_its_own_code(tmp_path):
    """No store where the rendezvous points (its node was lost): one line naming the rendezvous, exit
    EXIT_RENDEZVOUS (the EKS pod then exits EXIT_REPLACE and is replaced), a record for the launcher."""
    rdzv = ("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1")
    rdzv += ("--rdzv-conf", "is_host=false,read_timeout=2", "--rdzv-id", "lost-store")
    with FailureChannel() as channel:
        done = subprocess.run(
            agent_command(tmp_path, "waits", rdzv=rdzv),
            cwd=REPO,
            env={**channel.env, "PATH": "/usr/bin:/bin", NODE_ENV: "node-1"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        wait_for_records(channel)
        assert done.returncode == EXIT_RENDEZVOUS and "Traceback" not in done.stderr, done.stderr[-2000:]
        (record,) = channel.records
        assert cause_line(record).startswith("torchrun on node-1: rendezvous failed: RendezvousConnectionError: ")
        assert done.stderr.strip().splitlines()[-1] == record["cause"] and not record["permanent"]
    assert node_exit_code(done.returncode, record, None) == EXIT_REPLACE


def test_a_stopped_agent_says_so_in_one_line_and_exits_128_plus_the_signal(tmp_path):
    with FailureChannel() as channel:
        agent = subprocess.Popen(
            agent_command(tmp_path, "waits"),
            cwd=REPO,
            env={**channel.env, "PATH": "/usr/bin:/bin"},
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while not (tmp_path / "waits" / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        agent.send_signal(signal.SIGTERM)
        stderr = agent.communicate(timeout=60)[1]
    assert agent.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "torchrun: stopped by SIGTERM"


STOPPED_NODE = """
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from training.common.failure import send, worker_record

if sys.argv[1] == "finished":  # the run's last act, as training/common/run.py does it
    Path(sys.argv[2], "summary.json").write_text("{}")
send(worker_record(RuntimeError("stopped by SIGTERM at step 3")))
sys.exit(143)
"""


@pytest.mark.parametrize("finished", [True, False])
def test_a_node_stopped_after_the_run_finished_records_no_failure(tmp_path, monkeypatch, finished):
    """The operator ends a PyTorchJob once a worker succeeds and stops the others (a SageMaker job ending does the
    same): a node whose workers report "stopped" after the run published its summary exits 0 and leaves no
    failure.json; the same stop before the summary is a failure, recorded."""
    from trainkit.job import build
    from trainkit.run import node

    monkeypatch.setattr(node.signal, "signal", lambda signum, handler: None)  # pytest keeps its own handlers
    job = build({"model": "llama2-tiny", "run_id": "done", "runs_dir": str(tmp_path)})
    job.run_dir.mkdir(parents=True)
    script = tmp_path / "stopped_node.py"
    script.write_text(STOPPED_NODE)
    monkeypatch.setattr(node, "ready", lambda job, workload: SimpleNamespace(env={"PYTHONPATH": str(REPO)}))
    word = "finished" if finished else "running"
    monkeypatch.setattr(
        node, "torchrun_command", lambda *a, **kw: [sys.executable, str(script), word, str(job.run_dir)]
    )
    reports = []
    code = node.run_node(job, None, "localhost:0", "submission-1", "node-1", reports.append)
    if finished:
        assert (code, reports, (job.run_dir / "failure.json").exists()) == (0, [], False)
    else:
        assert code == 143 and len(reports) == 1 and "stopped by SIGTERM at step 3" in reports[0]
        assert json.loads((job.run_dir / "failure.json").read_text())["exit_code"] == 143


RAISES_ON_RANK_1 = """
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise ValueError("bad label 7 in shard 3 (expected 0..4)")
dist.barrier()
"""

EXITS_ON_RANK_1 = """
import os, sys, time

if os.environ["RANK"] == "1":
    print("fatal: the shard index /data/idx is missing", file=sys.stderr, flush=True)
    os._exit(5)
time.sleep(60)
"""

REFUSED_BY_ARGPARSE = """
import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--lr", required=True)
parser.parse_args()
"""


@pytest.mark.parametrize(
    ("text", "code", "line"),
    [
        (RAISES_ON_RANK_1, 1, r"node-a: rank 1: ValueError: bad label 7 in shard 3 \(expected 0\.\.4\); full log: "),
        # both ranks refuse at once: either is the cause
        (REFUSED_BY_ARGPARSE, EXIT_NO_RETRY, r"node-a: rank [01]: exited with code 2: s\.py: error: the following "),
        # no record at all: the agent tells rank 1's exit by its last line; rank 0, which it stopped, is no cause
        (EXITS_ON_RANK_1, 1, r"node-a: rank 1: exited with code 5: fatal: the shard index /data/idx is missing"),
    ],
    ids=["raises", "argparse", "exits"],
)
def test_on_a_cluster_node_a_scripts_own_failure_is_the_line_its_scheduler_shows(
    tmp_path, monkeypatch, text, code, line
):
    """run_node is what every cloud node runs (the EKS pod's entry point, a SageMaker host, a Batch node) and
    `report` is where each puts the line (termination message, failure file, status reason: tested with a recipe's
    cause on each target). A user's script, prepared and started as on a node, gives its own cause there."""
    from trainkit.backends import job_from_flags
    from trainkit.run import node
    from trainkit.services import free_port_pair
    from trainkit.workloads.script import script_workload

    monkeypatch.setattr(node.signal, "signal", lambda signum, handler: None)  # pytest keeps its own handlers
    monkeypatch.chdir(REPO)  # where a node's workers find `training` (an image has it installed)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "s.py").write_text(text)
    flags = {"workload": "script", "run_id": "s", "runs_dir": str(tmp_path / "runs"), "nproc": 2}
    job = job_from_flags({**flags, "max_restarts": 0, "metrics_port": 0})
    workload = script_workload(job, str(tmp_path / "code" / "s.py"), [])
    reports: list[str] = []
    exit_code = node.run_node(job, workload, f"127.0.0.1:{free_port_pair()}", "s-1", "node-a", reports.append)
    assert exit_code == code and len(reports) == 1 and re.match(line, reports[0]), reports
