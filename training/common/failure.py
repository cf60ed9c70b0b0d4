"""Why a worker failed, in one line, told to whoever launched it, and whether a restart can mend it.

A rank that dies of an exception sends one record over a Unix datagram socket its launcher made
(`TRAINKIT_FAILURE_CHANNEL`: the local launcher, or the EKS pod entry point). Nothing of that path
touches a file system, so the cause still arrives when the runs volume is full and the rank's own
log file cannot take another line. The launcher says it on the console and in `invoke status`
(trainkit/run/failures.py).

Exit codes a worker uses (the agent reads them, trainkit/run/agent.py):

- `EXIT_NO_RETRY` (3): the failure repeats on any restart with the same settings and data (a full or
  read-only volume, records that cannot be read, a diverged loss, memory too small for the job, a
  missing package). torchrun restarts nobody; the job ends with the cause. Not 2: that is the
  launcher's own "bad input" code. 1-127, so training-operator v1.9.4's `ExitCode` restart policy
  treats it as permanent too (pkg/util/train/train_util.go IsRetryableExitCode: `exitCode >= 128`).
- 1: anything else (a lost peer, a collective that timed out, an unknown error): restarted as before,
  up to --max-restarts.

A user's script knows nothing of the channel: trainkit starts it through `training.script` (its `main`), which runs
the file as `__main__` inside `reported()` and records a non-zero `sys.exit` too (argparse refusing an argument),
with the last line the script wrote to stderr. A rank that still ends without a record (`os._exit`, a crash in C) is
described by its agent, with the same last line (trainkit/run/agent.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Iterator

EXIT_NO_RETRY = 3
EXIT_USAGE = 2
"""A script's "bad arguments" (argparse, click): permanent, as the same arguments come back at every restart."""
CHANNEL_ENV = "TRAINKIT_FAILURE_CHANNEL"
NODE_ENV = "TRAINKIT_NODE"
"""The node's name in its reports (the local launcher's node-N; on EKS the pod's name, POD_NAME)."""
# A datagram stays far below the socket's buffer: a record's text fields are cut to FIELD_CHARS before it is sent.
MAX_RECORD_BYTES = 16 * 1024
FIELD_CHARS = 2000
MESSAGE_CHARS = 400
LAST_LINE_BYTES = 16 * 1024
# A sender waits at most this long for room on the channel (its reader drains it at once, trainkit/run/failures.py).
SEND_TIMEOUT_S = 1.0
# OS errors that a restart on the same volume meets again: no space, no quota, read-only, no permission,
# a file past the volume's size limit.
PERMANENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG})
# Exception classes, by name, that a restart meets again (matched by name so this module imports no torch):
# torch's out-of-memory error on an accelerator.
PERMANENT_NAMES = frozenset({"OutOfMemoryError"})
WHILE = "while "
# Secrets a worker may hold in its environment: an error message that quotes one (a URL with a token, a signed
# request) never carries it into a record, a termination message or a log line from here.
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


class NoRetry(Exception):
    """A failure that every restart would repeat: the job ends with it instead of restarting."""


class DataError(NoRetry, ValueError):
    """Training data that cannot be read or used (a record of the wrong shape, an image that does not decode)."""


def root_cause(error: BaseException) -> BaseException:
    """The exception that started it. torch.distributed.checkpoint gathers every rank's write error into one
    CheckpointException (`failures`: rank -> (exception, traceback)); its lowest rank's error is the cause."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        first = failures[min(failures)]
        inner = first[0] if isinstance(first, tuple) else first
        if isinstance(inner, BaseException):
            return root_cause(inner)
    return error


def permanent(error: BaseException) -> bool:
    """Whether a restart with the same settings and data would fail the same way."""
    cause = root_cause(error)
    return (
        isinstance(cause, (NoRetry, MemoryError, ImportError))
        or (isinstance(cause, OSError) and cause.errno in PERMANENT_ERRNOS)
        or type(cause).__name__ in PERMANENT_NAMES
    )


@contextlib.contextmanager
def doing(what: str) -> Iterator[None]:
    """Say what the process was doing when an error passes through: `with doing("writing checkpoint step-20")`
    makes the cause read "... while writing checkpoint step-20". The innermost context wins."""
    try:
        yield
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as error:
        if not any(note.startswith(WHILE) for note in getattr(error, "__notes__", ())):
            error.add_note(WHILE + what)
        raise


def describe(error: BaseException) -> str:
    """`OSError: [Errno 28] No space left on device while writing checkpoint step-00000020`: the root cause's
    type and the first line of its message, and what the process was doing."""
    cause = root_cause(error)
    lines = redact(str(cause)).strip().splitlines()  # before any cut, so no part of a secret is left
    if len(lines) > 1 and lines[0].startswith("Caught ") and lines[1].startswith("Original Traceback"):
        # torch's DataLoader re-raises a loader worker's error with its whole traceback as the message: the
        # worker's own message is the last line, after the exception's qualified name
        lines = [lines[-1].partition(": ")[2] or lines[-1]]
    message = (lines[0] if lines else "")[:MESSAGE_CHARS]
    notes = [*getattr(cause, "__notes__", ()), *getattr(error, "__notes__", ())]
    context = next((redact(note) for note in notes if note.startswith(WHILE)), None)
    text = f"{type(cause).__name__}: {message}" if message else type(cause).__name__
    return f"{text} {context}" if context else text


def redact(text: str) -> str:
    """`text` with the value of every secret in SECRET_ENV replaced by its name."""
    for name in SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 8:  # shorter values would be found in ordinary words
            text = text.replace(value, f"<{name}>")
    return text


def _log_file() -> str | None:
    """Where this process's stderr goes (torchrun redirects it to a file under the run's logs/)."""
    try:
        target = os.readlink("/proc/self/fd/2")
    except OSError:
        return None
    return target if target.startswith("/") else None


def node_name() -> str:
    """This process's node, as every record from it names it (a rank and its agent agree)."""
    return os.environ.get(NODE_ENV) or os.environ.get("POD_NAME") or socket.gethostname()


def last_line(path: str | None) -> str | None:
    """The last non-empty line of a log file (read from its tail: logs grow long), secrets redacted and cut to
    MESSAGE_CHARS; None when it has none or cannot be read. What a process that exits without an exception said last
    is usually why (argparse's "error: ..." line, a `sys.exit` message)."""
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - LAST_LINE_BYTES))
            tail = handle.read()
    except OSError:
        return None
    lines = [line.strip() for line in tail.decode(errors="replace").splitlines() if line.strip()]
    return redact(lines[-1])[:MESSAGE_CHARS] if lines else None


def _record(kind: str, cause: str, is_permanent: bool) -> dict:
    """A rank's record: who (torchrun's RANK, node, attempt), when, what, and whether to retry."""
    env = os.environ
    return {
        "source": "worker",
        "rank": int(env.get("RANK", 0)),
        "node": int(env.get("GROUP_RANK", 0)),
        "node_name": node_name(),
        "attempt": int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
        "time": time.time(),
        "host": socket.gethostname(),
        "type": kind,
        "cause": cause,
        "permanent": is_permanent,
        "log": _log_file(),
    }


def worker_record(error: BaseException) -> dict:
    """The record a rank that an exception ends sends."""
    return _record(type(root_cause(error)).__name__, describe(error), permanent(error))


def exit_record(code: int | str | None) -> dict:
    """The record of a script that called `sys.exit(code)` with a failure: the message it exits with (a text code,
    which Python prints on exit), else the last line it wrote to stderr. Exit code 2 is a usage error (argparse's
    and click's refusal of an argument; Python's own for a file it cannot open): every restart is given the same
    arguments, so it is permanent."""
    status = 1 if isinstance(code, str) else int(code or 0)
    said = redact(code.strip().splitlines()[0])[:MESSAGE_CHARS] if isinstance(code, str) and code.strip() else None
    said = said or last_line(_log_file())
    cause = f"exited with code {status}" + (f": {said}" if said else "")
    return {**_record("SystemExit", cause, status == EXIT_USAGE), "exit_code": status}


def channel_address(name: str) -> str | bytes:
    """A channel name as a socket address: `@name` is Linux's abstract namespace (no file anywhere), else a path."""
    return b"\0" + name[1:].encode() if name.startswith("@") else name


def send(record: dict) -> bool:
    """Send one record to the launcher's channel, if it has one. Never raises: a lost report must not hide
    the error it reports."""
    name = os.environ.get(CHANNEL_ENV)
    if not name:
        return False
    capped = {key: value[:FIELD_CHARS] if isinstance(value, str) else value for key, value in record.items()}
    data = json.dumps(capped).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.settimeout(SEND_TIMEOUT_S)
            sock.sendto(data, channel_address(name))
    except OSError:
        return False
    return True


def _say(text: str) -> None:
    """To stderr if it still takes writes (on a full volume it does not), secrets redacted."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(redact(text))
        sys.stderr.flush()


@contextlib.contextmanager
def reported(exits: bool = False) -> Iterator[None]:
    """Run a worker's body: an exception that escapes it is sent to the launcher as one record, shown in the
    rank's log (when the log can still be written), and ends the process with EXIT_NO_RETRY or 1. SystemExit
    (a deliberate stop) passes untouched, unless `exits` (a user's script, whose `sys.exit(2)` is a failure): then
    a non-zero one is recorded too and ends the process with its own code (EXIT_NO_RETRY when permanent)."""
    try:
        yield
    except KeyboardInterrupt:
        raise
    except SystemExit as stop:
        if not exits or stop.code in (None, 0):
            raise
        if isinstance(stop.code, str):
            _say(stop.code + "\n")  # what Python prints for a text code, which os._exit below would skip
        _end(exit_record(stop.code))
    except BaseException as error:
        record = worker_record(error)
        if not isinstance(root_cause(error), NoRetry):  # ours say all there is; others get their traceback
            _say("".join(traceback.format_exception(error)))
        _end({**record, "exit_code": EXIT_NO_RETRY if record["permanent"] else 1})


def _end(record: dict) -> None:
    """Send the record, say it in one line in the rank's log, and end the process with its code: at once, as a
    rank whose peers may hang in a collective must not wait in teardown."""
    send(record)
    retry = "not restarted: a restart would fail the same way" if record["permanent"] else "may be restarted"
    _say(f"error: rank {record['rank']}: {record['cause']} ({retry})\n")
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(EXIT_NO_RETRY if record["permanent"] else record["exit_code"])


def cause_line(record: dict) -> str:
    """One line for a record: `rank 0: OSError: [Errno 28] No space left on device while writing checkpoint
    step-00000020; full log: <file>`. Records of the agent (a rank killed by a signal, or one that exited
    without a record) say how the process ended, and what it wrote last."""
    if record.get("source") != "worker" and record.get("cause"):
        # the launcher's own finding (the c10d store's node is gone), or an agent's (its rendezvous failed)
        text = record["cause"]
    elif record.get("source") == "worker":
        text = f"rank {record['rank']}: {record['cause']}"
    elif record.get("signal"):
        text = f"rank {record['rank']}: killed by {record['signal']}"
        if record["signal"] == "SIGKILL":
            text += " (the kernel's out-of-memory killer sends it: `dmesg` says whether it did)"
    elif record.get("last_line"):
        text = f"rank {record['rank']}: exited with code {record.get('exit_code')}: {record['last_line']}"
    else:
        text = f"rank {record['rank']}: exited with code {record.get('exit_code')} and recorded no error"
    return f"{text}; full log: {record['log']}" if record.get("log") else text
