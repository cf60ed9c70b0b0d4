"""trainkit's torchrun (trainkit/run/agent.py) with real agents and workers: a worker's "do not retry" exit ends
the group at once, any other failure is restarted as torchrun does, and every failure reaches the launcher's
channel in one record, also from a worker killed by a signal. The workers are small scripts, so each case costs
an agent's start and no training."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from training.common.failure import EXIT_NO_RETRY, cause_line
from trainkit.run.failures import FailureChannel, failure_summary, wait_for_records

WORKER = """
import errno, os, signal, sys
from pathlib import Path
from training.common.failure import DataError, doing, reported

Path(sys.argv[1], f"attempt-{os.environ['TORCHELASTIC_RESTART_COUNT']}").touch()
with reported():
    if sys.argv[2] == "no-space":
        with doing("writing checkpoint step-00000020"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "shard.distcp")
    if sys.argv[2] == "bad-data":
        raise DataError("line 3: field 'prompt' is int (7), not text")
    if sys.argv[2] == "lost-peer":
        raise RuntimeError("Connection closed by peer [127.0.0.1]:29500")
    if sys.argv[2] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
"""


def run_agent(tmp_path: Path, mode: str) -> tuple[int, list[int], FailureChannel]:
    """(exit code, the attempts that ran, the channel with what arrived) of a one-worker group, 2 restarts allowed."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / mode
    out.mkdir()
    channel = FailureChannel()
    command = [sys.executable, "-m", "trainkit.run.agent", "--standalone", "--nproc-per-node", "1"]
    command += ["--max-restarts", "2", "--monitor-interval", "0.1", "--log-dir", str(tmp_path / "logs"), "--redirects"]
    command += ["3", str(script), str(out), mode]
    done = subprocess.run(
        command, cwd=REPO, env={**channel.env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120
    )
    wait_for_records(channel)
    attempts = sorted(int(p.name.split("-")[1]) for p in out.glob("attempt-*"))
    assert "Traceback" not in done.stderr.split("torchrun:")[-1], done.stderr[-2000:]  # no ChildFailedError wall
    return done.returncode, attempts, channel


def agent_log(channel: FailureChannel) -> str:
    (log,) = {r["log"] for r in channel.records if r["source"] == "agent"}
    return log


@pytest.mark.parametrize(
    ("mode", "cause"),
    [
        (
            "no-space",
            "OSError: [Errno 28] No space left on device: 'shard.distcp' while writing checkpoint step-00000020",
        ),
        ("bad-data", "DataError: line 3: field 'prompt' is int (7), not text"),
    ],
)
def test_a_failure_no_restart_mends_ends_the_group_at_once(tmp_path, mode, cause):
    code, attempts, channel = run_agent(tmp_path, mode)
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
