"""The launcher's end of the failure channel: gather what failing ranks and agents report, pick the cause,
keep it where `invoke status` finds it.

Workers and torchrun agents send one JSON record per failure (training/common/failure.py,
trainkit/run/agent.py) to a Unix datagram socket made here. On Linux its name lives in the abstract
namespace, so no file system is involved: a full runs volume cannot lose the cause. The local
launcher and the EKS pod entry point each make one for the processes they start.

The cause of a failed job, in order: the first record whose failure a restart cannot mend (that is
what ended the job); else, of each node's latest attempt, a torchrun that could not meet its peers;
else a rank killed from outside or crashed (SIGKILL, SIGSEGV ...: its peers' reports of the broken
collective follow from it); else the first record a worker sent; else the agent's (a rank that exited with a
code and no record, described by its last line). Ranks an agent stopped because another failed are effects and
come last, whatever their rank or the order their records arrived in.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from training.common.failure import CHANNEL_ENV, MAX_RECORD_BYTES, cause_line, channel_address
from training.common.files import publish_text
from trainkit.errors import SpecError
from trainkit.paths import make_folder, state_dir

CRASH_SIGNALS = ("SIGKILL", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE")
"""Signals that end a rank from outside its code (the out-of-memory killer) or in a crash: the rank is the cause."""
CAUSE_SETTLE_S = 0.3
RECEIVE_POLL_S = 0.1
"""How often the channel's reader looks whether the channel was closed."""
FAILURE_FILE = "failure.json"
"""In the run folder: the cause of the run's last failure (removed when it is launched again)."""
FAILURES_DIR = "failures"
"""Under the state dir: the same record when the run folder cannot take it (a full volume)."""


class FailureChannel:
    """A socket the launcher's processes send failure records to. A thread takes each datagram off the socket
    as it arrives: Linux queues at most net.unix.max_dgram_qlen (10) unread datagrams on a Unix socket and a
    sender then waits, so a job of many ranks whose failures all come at once would otherwise stall its agents
    (and their restarts) until the launcher read. `poll` returns what arrived since its last call."""

    def __init__(self):
        self.records: list[dict] = []
        self._arrived: list[dict] = []
        self._lock = threading.Lock()
        self._folder = None
        if sys.platform.startswith("linux"):
            self.name = f"@trainkit-failures-{uuid.uuid4().hex}"
        else:  # no abstract namespace: a socket file in the temporary folder (not on the runs volume)
            self._folder = tempfile.TemporaryDirectory(prefix="trainkit-failures-")
            self.name = str(Path(self._folder.name) / "channel")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(channel_address(self.name))
        self.sock.settimeout(RECEIVE_POLL_S)
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, name="failure-channel", daemon=True)
        self._reader.start()

    @property
    def env(self) -> dict[str, str]:
        """What the processes need to reach this channel (they inherit it through torchrun)."""
        return {CHANNEL_ENV: self.name}

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                data = self.sock.recv(MAX_RECORD_BYTES)
            except (TimeoutError, InterruptedError):
                continue
            except OSError:  # closed
                return
            self._take(data)

    def _take(self, data: bytes) -> None:
        """Keep one datagram if it is a record. Anything else (any local process can reach the channel) is dropped,
        never allowed to end the reader."""
        try:
            record = json.loads(data)
        except (ValueError, RecursionError):
            return
        if isinstance(record, dict) and "rank" in record:
            with self._lock:
                self._arrived.append(record)

    def _drain(self) -> None:
        """Take what the socket still holds, without waiting (after the reader stopped)."""
        self.sock.setblocking(False)
        while True:
            try:
                self._take(self.sock.recv(MAX_RECORD_BYTES))
            except OSError:  # nothing left (BlockingIOError), or the socket is gone
                return

    def poll(self) -> list[dict]:
        """The records that arrived since the last call (also kept in `records`)."""
        with self._lock:
            new, self._arrived = self._arrived, []
        self.records += new
        return new

    def permanent(self) -> bool:
        """Whether a failure no restart mends was reported (a worker's, or its agent's: the worker exited with
        EXIT_NO_RETRY); `pick_cause` says which record names it."""
        return any(r.get("permanent") for r in self.records)

    def cause(self) -> dict | None:
        """The cause among what arrived, after a moment for reports still on their way (see wait_for_records)."""
        wait_for_records(self, CAUSE_SETTLE_S)
        return pick_cause(self.records)

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._reader.join()
            self._drain()
            self.sock.close()
        self.poll()
        if self._folder is not None:
            self._folder.cleanup()

    def __enter__(self) -> FailureChannel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _when(record: dict) -> float:
    return float(record.get("time", 0))


def _node(record: dict) -> str:
    return str(record.get("node_name", record.get("node", "")))


def _effect(record: dict, stopped: dict[tuple, float]) -> bool:
    """Whether a record tells of a rank its agent stopped because another one failed: its agent's record says
    `stopped`, and what the rank itself reported after the agent found the other failure (`stopped_at`) follows from
    it. What it reported before is its own failure, whose process was still ending when the agent looked (a script's
    teardown after an exception, say)."""
    if record.get("stopped"):
        return True
    found = stopped.get((_node(record), record.get("rank"), record.get("attempt")))
    return found is not None and _when(record) >= found


def pick_cause(records: list[dict]) -> dict | None:
    """The record that says why the job failed (see the module's docstring), or None. Within a group the first in
    time wins (a worker's record carries when it failed; an agent's, when it saw the exit), never a rank the agent
    stopped after another had failed, unless nothing else was reported."""
    if not records:
        return None
    ordered = sorted(records, key=_when)
    # Each node counts its own attempts (an agent that restarts for a waiting node spends none), so "the latest
    # attempt" is each node's own latest; a record without an attempt (an agent's own failure) is always current.
    latest: dict[str, int] = {}
    for r in ordered:
        if "attempt" in r:
            latest[_node(r)] = max(latest.get(_node(r), 0), int(r["attempt"]))
    current = [r for r in ordered if "attempt" not in r or int(r["attempt"]) == latest[_node(r)]]
    stopped = {
        (_node(r), r.get("rank"), r.get("attempt")): r.get("stopped_at") or _when(r)
        for r in records
        if r.get("stopped")
    }
    causes = [r for r in ordered if not _effect(r, stopped)]
    now = [r for r in current if not _effect(r, stopped)]
    groups = (
        [r for r in causes if r.get("source") == "worker" and r.get("permanent")],
        [r for r in causes if r.get("source") == "agent" and r.get("permanent")],  # its worker's record was lost
        [r for r in now if r.get("source") == "agent" and r.get("cause")],  # torchrun's own: the rendezvous
        # A rank the kernel or a fault killed (SIGKILL, SIGSEGV, SIGBUS ...) sends nothing itself; its peers then
        # report a broken collective, which is the effect, not the cause. Not SIGTERM (the agent's own stop) nor
        # SIGABRT (NCCL's watchdog aborts the peers of a rank that raised: effects again).
        [r for r in now if r.get("source") == "agent" and r.get("signal") in CRASH_SIGNALS],
        [r for r in now if r.get("source") == "worker"],
        [r for r in now if r.get("source") == "agent"],  # an exit with a code and no record: its last line
        [r for r in ordered if r.get("permanent")],  # a stopped rank's failure no restart mends: why it ended
        current,
    )
    return next((group[0] for group in groups if group), ordered[0])


def failure_summary(record: dict) -> str:
    """The cause as the console and `invoke status` show it, with whether it was retried."""
    retried = " (not restarted: a restart would fail the same way)" if record.get("permanent") else ""
    return cause_line(record) + retried


# ---------------------------------------------------------------- keeping it for `invoke status`


def _spare_path(run_dir: Path) -> Path:
    key = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
    return state_dir() / FAILURES_DIR / f"{key}.json"


def record_failure(run_dir: Path, record: dict, exit_code: int, submission: str | None = None) -> Path | None:
    """Keep the cause in the run folder, or, when that cannot be written (a full volume), in the state dir.
    `submission`: which launch of the run failed (eks: the rendezvous id of the PyTorchJob). Returns where it went
    (None: nowhere could take it; the console still said it)."""
    kept = {**record, "line": failure_summary(record), "exit_code": exit_code, "run_dir": str(run_dir)}
    text = json.dumps(kept | ({"submission": submission} if submission else {}))
    for path in (run_dir / FAILURE_FILE, _spare_path(run_dir)):
        with contextlib.suppress(OSError, SpecError):  # a state folder trainkit refuses keeps nothing either
            return publish_text(make_folder(path.parent) / path.name, text + "\n")  # the state dir: made private
    return None


def recorded_failure(run_dir: Path) -> dict | None:
    """The run's last failure, from the run folder or the state dir (the newer one)."""
    found = []
    for path in (run_dir / FAILURE_FILE, _spare_path(run_dir)):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text()))
    return max(found, key=_when) if found else None


def forget_failure(run_dir: Path, submission: str | None = None) -> None:
    """A new launch of the run: the last one's failure is history (events.jsonl keeps the run's story).
    `submission`: the launch that is starting; a failure it recorded itself stays (on EKS each pod of a job forgets
    the failures of earlier jobs when it starts, and a pod that starts late must not erase one its peers just
    recorded)."""
    for path in (run_dir / FAILURE_FILE, _spare_path(run_dir)):
        with contextlib.suppress(OSError, ValueError):
            if submission is None or json.loads(path.read_text()).get("submission") != submission:
                path.unlink(missing_ok=True)


def wait_for_records(channel: FailureChannel, seconds: float = 0.5) -> None:
    """Give reports sent just before their processes exited a moment to arrive (datagrams are queued at once;
    this covers a sender still inside sendto when its agent returned)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if channel.poll():
            deadline = max(deadline, time.monotonic() + 0.1)
        time.sleep(0.05)
