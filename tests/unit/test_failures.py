"""A failed rank's one line and its verdict (training/common/failure.py), the launcher's choice of cause and where it
keeps it (trainkit/run/failures.py), and the pod's exit code for the operator (trainkit/backends/eks/pod.py)."""

from __future__ import annotations

import contextlib
import errno
import os
import time

import pytest

from tests.helpers.jobs import build_spec
from training.common.failure import (
    CHANNEL_ENV,
    EXIT_NO_RETRY,
    FIELD_CHARS,
    SEND_TIMEOUT_S,
    DataError,
    cause_line,
    describe,
    doing,
    exit_record,
    last_line,
    permanent,
    redact,
    send,
    worker_record,
)
from training.common.files import append_event, publish_rank_files
from training.common.run import Diverged
from trainkit.backends import RunRef
from trainkit.backends.local.runs import launch_command, record_launch, status
from trainkit.run.failures import (
    FailureChannel,
    forget_failure,
    pick_cause,
    record_failure,
    recorded_failure,
    wait_for_records,
)
from trainkit.run.node import node_exit_code
from trainkit.run.prepare import write_spec
from trainkit.run.state import RunState


def no_space() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def raised(error: BaseException, *contexts: str) -> BaseException:
    """`error` as it arrives after passing through `doing(context)` blocks, the innermost first."""
    try:
        with contextlib.ExitStack() as stack:
            for context in reversed(contexts):
                stack.enter_context(doing(context))
            raise error
    except BaseException as caught:
        return caught


class CheckpointException(BaseException):
    """torch.distributed.checkpoint's: every rank's write error in `failures` (rank -> (exception, traceback))."""

    def __init__(self, failures: dict):
        super().__init__(f"CheckpointException ranks:{failures.keys()}")
        self.failures = failures


def test_the_cause_names_the_root_error_and_what_the_rank_was_doing():
    error = raised(no_space(), "writing checkpoint step-00000020", "training")
    assert describe(error) == "OSError: [Errno 28] No space left on device while writing checkpoint step-00000020"
    wrapped = CheckpointException({1: (ValueError("later"), None), 0: (no_space(), None)})
    wrapped.add_note("while writing checkpoint step-00000008")
    assert describe(wrapped) == "OSError: [Errno 28] No space left on device while writing checkpoint step-00000008"
    assert permanent(wrapped)
    loader = DataError(
        "Caught DataError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\ntraining.common.failure.DataError: image train/a/1.JPEG does not decode'
    )
    assert describe(loader) == "DataError: image train/a/1.JPEG does not decode"
    assert describe(RuntimeError()) == "RuntimeError"


def test_a_secret_an_error_quotes_never_reaches_the_record(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    error = OSError(errno.EACCES, "denied for https://user:hf_abcdefghijklmnop@huggingface.co/x")
    record = worker_record(error)
    assert "hf_abcdefghijklmnop" not in str(record) and "https://<redacted>@huggingface.co" in record["cause"]
    cut = RuntimeError("y" * 390 + "hf_abcdefghijklmnop")  # the cut at 400 characters falls inside the token
    assert "hf_abcdefgh" not in describe(cut) and describe(cut).endswith("<HF_TOKEN>")


@pytest.mark.parametrize(
    ("said", "shown"),
    [
        ("GET https://bob:s3cr3t@host/x", "GET https://<redacted>@host/x"),
        (
            "403 on s3://b/k?X-Amz-Credential=ASIAQ%2F2026&X-Amz-Security-Token=IQoJ&X-Amz-Signature=ab12 (expired)",
            "403 on s3://b/k?X-Amz-Credential=<redacted>&X-Amz-Security-Token=<redacted>&X-Amz-Signature=<redacted> "
            "(expired)",
        ),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30", "Authorization: Bearer <redacted>"),
        ("no access for AKIAIOSFODNN7EXAMPLE today", "no access for <redacted> today"),
        ("token hf_abcdefghijklmnopqrstuvwxyz1234 refused", "token <redacted> refused"),
    ],
)
def test_credentials_a_script_got_elsewhere_are_redacted_by_their_shape(said, shown):
    """A cause goes where more people read it than a rank's log (a termination message, SageMaker's failure reason):
    credentials not in the environment (a node role's session in a presigned URL, a script's own) are cut out too."""
    assert redact(said) == shown


@pytest.mark.parametrize(
    ("error", "verdict"),
    [
        (no_space(), True),
        (OSError(errno.EDQUOT, "quota"), True),
        (OSError(errno.EROFS, "read-only"), True),
        (PermissionError(errno.EACCES, "denied"), True),
        (DataError("bad record"), True),
        (Diverged("loss nan"), True),
        (MemoryError(), True),
        (type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory"), True),
        (ModuleNotFoundError("No module named 'flash_attn'"), True),
        (ConnectionResetError(errno.ECONNRESET, "reset"), False),
        (RuntimeError("[Gloo] Connection closed by peer"), False),
        (TimeoutError("collective timed out"), False),
        (KeyError("x"), False),
    ],
)
def test_only_failures_a_restart_repeats_are_permanent(error, verdict):
    assert permanent(error) is verdict


def test_the_cause_is_the_failure_that_ended_the_job():
    lost = {"source": "worker", "rank": 1, "attempt": 0, "time": 1.0, "permanent": False, "cause": "RuntimeError: x"}
    full = {"source": "worker", "rank": 0, "attempt": 0, "time": 2.0, "permanent": True, "cause": "OSError: y"}
    killed = {"source": "agent", "rank": 3, "attempt": 0, "time": 0.5, "signal": "SIGKILL", "exit_code": -9}
    assert pick_cause([lost, full, killed]) is full  # no restart mends it: the job ended there
    later = {**lost, "attempt": 2, "time": 9.0, "rank": 0}
    assert pick_cause([lost, later, killed]) is later  # restarts spent: the last attempt's first report
    oom = {**killed, "attempt": 2, "time": 9.5}  # killed, then its peers saw the collective break
    assert pick_cause([lost, later, oom]) is oom
    stopped = {**oom, "signal": "SIGTERM", "exit_code": -15}  # the agent's own stop says nothing
    assert pick_cause([later, stopped]) is later
    exited_3 = {"source": "agent", "rank": 1, "attempt": 0, "time": 3.0, "exit_code": 3, "permanent": True}
    assert pick_cause([oom, exited_3]) is exited_3  # the worker's own record was lost, its exit code says enough
    raised = {**later, "time": 9.0}
    aborted = {**oom, "signal": "SIGABRT", "exit_code": -6, "time": 9.2}  # NCCL's watchdog ends the peers
    assert pick_cause([raised, aborted]) is raised
    assert pick_cause([killed]) is killed and pick_cause([]) is None
    assert cause_line(killed).startswith("rank 3: killed by SIGKILL")
    assert (
        cause_line({"source": "agent", "rank": 2, "exit_code": 1}) == "rank 2: exited with code 1 and recorded no error"
    )
    assert cause_line({**full, "log": "/r/0/stderr.log"}) == "rank 0: OSError: y; full log: /r/0/stderr.log"


def test_the_cause_is_the_first_failure_in_time_never_a_rank_the_agent_stopped_after_it():
    """The issue's run: rank 1 raised; rank 0, still in a collective, was stopped by its agent (SIGTERM) and may
    have reported the broken collective first, in rank order or even in time."""
    raised = {"source": "worker", "rank": 1, "node_name": "n", "attempt": 3, "time": 2.0, "cause": "ValueError: 7"}
    broken = {**raised, "rank": 0, "time": 2.01, "cause": "RuntimeError: Connection closed by peer"}
    term = {"source": "agent", "rank": 0, "node_name": "n", "attempt": 3, "time": 2.1, "signal": "SIGTERM"}
    term["stopped"], term["stopped_at"] = True, 2.005  # the agent found rank 1's exit then, and stopped rank 0
    exited = {**term, "rank": 1, "signal": None, "exit_code": 1, "stopped": False, "stopped_at": None}
    assert pick_cause([term, exited, broken, raised]) is raised
    # what a rank reported while its agent stopped it is an effect, whatever order it arrived in
    assert pick_cause([broken, term, exited, raised]) is raised
    # a rank that exits with a code and records nothing (os._exit, a crash in C): its own last words
    argv = {**exited, "exit_code": 2, "last_line": "train.py: error: the following arguments are required: --lr"}
    assert pick_cause([term, broken, argv]) is argv
    # a rank whose own failure came first, still ending (a script's teardown) when its peer, which reported the
    # broken collective and aborted, exited: stopped by its agent, and still the cause
    slow = {**term, "rank": 1, "stopped_at": 2.5, "time": 2.6}
    aborted = {**term, "signal": "SIGABRT", "stopped": False, "stopped_at": None, "time": 2.5}
    assert pick_cause([aborted, slow, broken, raised]) is raised
    assert cause_line(argv) == "rank 1: exited with code 2: train.py: error: the following arguments are required: --lr"
    assert pick_cause([term]) is term  # nothing else was reported: better than nothing


def test_a_script_that_exits_with_a_failure_says_why(tmp_path, monkeypatch):
    """A script's sys.exit: a text code is its message; a number, what it wrote last to stderr (argparse prints its
    refusal, then exits 2: a usage error, which every restart would repeat)."""
    log = tmp_path / "stderr.log"
    log.write_text("usage: train.py [-h] --lr LR\ntrain.py: error: the following arguments are required: --lr\n\n")
    monkeypatch.setattr("training.common.failure._log_file", lambda: str(log))
    monkeypatch.setenv("RANK", "3")
    usage = exit_record(2)
    assert usage["cause"] == "exited with code 2: train.py: error: the following arguments are required: --lr"
    assert usage["permanent"] and usage["rank"] == 3 and usage["type"] == "SystemExit"
    said = exit_record("no GPU visible; set CUDA_VISIBLE_DEVICES\nsecond line")
    assert said["cause"] == "exited with code 1: no GPU visible; set CUDA_VISIBLE_DEVICES" and not said["permanent"]
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    log.write_text("denied: the token hf_abcdefghijklmnop\n")
    assert last_line(str(log)) == "denied: the token <HF_TOKEN>" and last_line(str(tmp_path / "none")) is None
    log.write_text("fatal: the shard index is gone\n\r 10%|#   | 1/10 [00:01<00:09, 1.0it/s]\r 20%|##  | 2/10\n")
    assert last_line(str(log)) == "fatal: the shard index is gone"  # a progress bar after it says nothing
    assert exit_record(3)["permanent"] and exit_record(["a", "list"])["cause"] == "exited with code 1: ['a', 'list']"


def test_each_node_counts_its_own_attempts_and_a_torchrun_that_cannot_meet_its_peers_comes_first():
    a = {"source": "worker", "rank": 0, "node_name": "a", "attempt": 3, "time": 5.0, "cause": "RuntimeError: x"}
    b = {"source": "worker", "rank": 1, "node_name": "b", "attempt": 1, "time": 4.0, "cause": "OSError: y"}
    b_old = {**b, "attempt": 0, "time": 1.0}
    assert pick_cause([a, b, b_old]) is b  # b's latest attempt counts although a counted more
    store = {"source": "agent", "rank": None, "node_name": "b", "time": 6.0, "cause": "torchrun on b: rendezvous"}
    assert pick_cause([a, b, store]) is store  # no attempt: always current; why node b's torchrun ended
    assert cause_line(store) == "torchrun on b: rendezvous"


def test_records_reach_the_channel_without_a_file(monkeypatch):
    with FailureChannel() as channel:
        assert channel.name.startswith("@")  # Linux's abstract namespace: nothing on any volume
        monkeypatch.setenv(CHANNEL_ENV, channel.name)
        assert send({"source": "worker", "rank": 0, "time": 1.0, "permanent": True, "cause": "OSError: y"})
        wait_for_records(channel, 0.3)
        assert channel.records[0]["cause"] == "OSError: y" and channel.permanent()
    monkeypatch.setenv(CHANNEL_ENV, "@nobody-listens")
    assert send({"rank": 0}) is False  # a lost report never raises over the error it reports
    monkeypatch.delenv(CHANNEL_ENV)
    assert send({"rank": 0}) is False


def test_a_burst_of_records_all_arrive_while_nobody_polls(monkeypatch):
    """Many ranks failing at once: Linux queues 10 unread datagrams on a Unix socket, then a sender waits. The
    channel's reader takes them off at once, so none waits and none is lost before the launcher looks."""
    with FailureChannel() as channel:
        monkeypatch.setenv(CHANNEL_ENV, channel.name)
        started = time.monotonic()
        sent = [send({"source": "worker", "rank": rank, "time": float(rank), "cause": "x"}) for rank in range(64)]
        took = time.monotonic() - started
        time.sleep(0.3)
        assert all(sent) and took < 5 * SEND_TIMEOUT_S
        assert sorted(r["rank"] for r in channel.poll()) == list(range(64))


def test_a_long_record_is_cut_field_by_field_and_still_parses(monkeypatch):
    with FailureChannel() as channel:
        monkeypatch.setenv(CHANNEL_ENV, channel.name)
        assert send({"source": "worker", "rank": 0, "cause": "x" * 50_000, "log": "/l"})
        time.sleep(0.3)
        (record,) = channel.poll()
        assert record["log"] == "/l" and record["cause"] == "x" * FIELD_CHARS


@pytest.mark.parametrize(
    ("torchrun", "cause", "received", "code"),
    [
        (0, None, None, 0),
        (EXIT_NO_RETRY, None, None, EXIT_NO_RETRY),
        (1, {"permanent": True}, None, EXIT_NO_RETRY),
        (1, {"permanent": False}, None, 1),  # torchrun spent its own restarts: permanent for the operator
        (-9, None, None, 137),  # killed: retryable (>= 128), the operator replaces the pod
        (1, None, 15, 143),  # the kubelet stopped it
        (EXIT_NO_RETRY, {"permanent": True}, 15, EXIT_NO_RETRY),  # a stop after a permanent failure changes nothing
    ],
)
def test_the_node_exit_code_tells_the_operator_whether_to_replace_the_pod(torchrun, cause, received, code):
    assert node_exit_code(torchrun, cause, received) == code


def test_a_cause_the_full_run_folder_cannot_take_goes_to_the_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))
    spec = build_spec({"model": "llama2-tiny", "runs_dir": str(tmp_path / "runs"), "run_id": "full"})
    write_spec(spec.job)
    (spec.run_dir / "failure.json").mkdir()  # the run folder's copy cannot be written (as on a full volume)
    cause = {"source": "worker", "rank": 0, "time": 5.0, "permanent": True, "cause": "OSError: [Errno 28] No space"}
    kept = record_failure(spec.run_dir, cause, EXIT_NO_RETRY)
    assert kept is not None and kept.is_relative_to(tmp_path / "state")
    assert recorded_failure(spec.run_dir)["cause"] == cause["cause"]
    forget_failure(spec.run_dir)
    assert recorded_failure(spec.run_dir) is None


def test_status_says_failed_and_why_until_the_run_is_launched_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))
    spec = build_spec({"model": "llama2-tiny", "runs_dir": str(tmp_path / "runs"), "run_id": "broke"})
    write_spec(spec.job)
    monkeypatch.setattr("sys.argv", ["/venv/bin/invoke", "train", "--run-id", "broke", "--lr", "1e-3"])
    for rank in (0, 1, 2):  # an earlier launch on 3 processes
        publish_rank_files(spec.run_dir, rank, {"stderr": f"/logs/{rank}/stderr.log"})
    record_launch(spec.run_dir, 2)
    assert sorted(p.name for p in (spec.run_dir / "logs" / "ranks").iterdir()) == ["0.json", "1.json"]
    for submission, node, attempt in [("a", "node-0", 0), ("a", "node-0", 1), ("b", "node-0", 0), ("b", "node-1", 0)]:
        append_event(spec.run_dir, "attempt", node=node, attempt=attempt, submission=submission)
    append_event(spec.run_dir, "resume", step=20)
    cause = {"source": "worker", "rank": 1, "time": 5.0, "permanent": True, "cause": "DataError: line 3", "log": "/l"}
    assert record_failure(spec.run_dir, cause, EXIT_NO_RETRY) == spec.run_dir / "failure.json"
    found = status(RunRef("broke", str(tmp_path / "runs")))
    shown = found.text
    assert found.state is RunState.FAILED and shown.splitlines()[0].endswith(": failed")
    assert "  cause      rank 1: DataError: line 3; full log: /l (not restarted: a restart would fail" in shown
    assert recorded_failure(spec.run_dir)["exit_code"] == EXIT_NO_RETRY
    # 3 attempts in 2 launches (two nodes of one launch count once): 1 restart by torchrun
    restarts = (
        "torchrun restarted the workers 1 time (3 attempts in 2 launches); the job resumed from a checkpoint 1 time"
    )
    assert f"  restarts   {restarts}\n" in shown
    again = "mend the cause; the same command resumes from the last checkpoint: invoke train --run-id broke --lr 1e-3"
    assert f"  again      {again}\n" in shown
    record_failure(spec.run_dir, {**cause, "type": "Diverged", "time": 6.0}, EXIT_NO_RETRY)
    assert "  again      not resumed: change --lr" in status(RunRef("broke", str(tmp_path / "runs"))).text
    forget_failure(spec.run_dir)
    lost = status(RunRef("broke", str(tmp_path / "runs")))
    assert lost.state is RunState.LOST and ": not running" in lost.text.splitlines()[0]


def test_a_launch_forgets_only_the_failures_of_earlier_launches(tmp_path, monkeypatch):
    """EKS: every pod of a new job forgets an earlier job's cause when it starts, but not one a peer of its own job
    recorded just before (a late pod must not erase why its job is ending)."""
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    cause = {"source": "worker", "rank": 0, "time": 5.0, "permanent": True, "cause": "DataError: line 3"}
    record_failure(run_dir, cause, EXIT_NO_RETRY, submission="job-b")
    forget_failure(run_dir, submission="job-b")
    assert recorded_failure(run_dir)["submission"] == "job-b"
    forget_failure(run_dir, submission="job-c")
    assert recorded_failure(run_dir) is None
    record_failure(run_dir, cause, EXIT_NO_RETRY)  # the local target's record names no submission
    forget_failure(run_dir, submission="job-c")
    assert recorded_failure(run_dir) is None


def test_a_closed_rendezvous_is_permanent_and_a_lost_store_is_not():
    from torch.distributed import DistNetworkError
    from torch.distributed.elastic.rendezvous.api import RendezvousClosedError, RendezvousConnectionError

    from trainkit.run.agent import EXIT_RENDEZVOUS, rendezvous_record

    try:
        try:
            raise DistNetworkError("failed to connect to 10.0.0.1:29400")
        except DistNetworkError as inner:
            raise RendezvousConnectionError(
                "The connection to the C10d store has failed. See inner exception."
            ) from inner
    except RendezvousConnectionError as error:
        lost = rendezvous_record(error, closed=False)
    assert lost["exit_code"] == EXIT_RENDEZVOUS and not lost["permanent"]
    assert lost["cause"].endswith(
        "has failed. See inner exception. (DistNetworkError: failed to connect to 10.0.0.1:29400)"
    )
    closed = rendezvous_record(RendezvousClosedError(), closed=True)
    assert closed["exit_code"] == EXIT_NO_RETRY and closed["permanent"]
    assert ": rendezvous closed: RendezvousClosedError" in closed["cause"]
    assert node_exit_code(EXIT_NO_RETRY, closed, None) == EXIT_NO_RETRY
    assert node_exit_code(EXIT_RENDEZVOUS, lost, None) > 128


def test_the_launch_command_reads_as_a_user_would_type_it_again():
    assert launch_command(["/x/.venv/bin/invoke", "run", "--script", "my train.py", "--", "--lr", "1"]) == (
        "invoke run --script 'my train.py' -- --lr 1"
    )
    assert launch_command(["/repo/trainkit/__main__.py", "train"]) == "python -m trainkit train"
