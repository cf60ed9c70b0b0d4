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
with the last line the script wrote to stderr. A rank that still ends with an exit code and no record (`os._exit`,
an exit from native code) is described by its agent, with the same last line (trainkit/run/agent.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
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
PROGRESS_BAR = re.compile(r"\d+%\||\d+(?:\.\d+)?(?:it|s)/(?:s|it)\]")
"""tqdm's bar (`42%|####  |`) or its rate (`3.1it/s]`): no reason why a process ended."""
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
SECRET_ENV = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "MLFLOW_TRACKING_TOKEN",  # an MLflow server's bearer token (MLflow's client reads it from the environment)
    "MLFLOW_TRACKING_PASSWORD",
)
# Credentials by their shape, wherever they came from (a script's own, a node role's session in a presigned URL): the
# secret is the first group. The user and password in a URL; a signed AWS request's token, signature and credential
# (SigV4 query parameters); a bearer token; an AWS access key id (AKIA long-term, ASIA temporary); a Hugging Face
# token (hf_ and its body).
SECRET_PATTERNS = tuple(
    re.compile(pattern)
    for pattern in (
        r"[A-Za-z][A-Za-z0-9+.-]*://([^/\s:@]+:[^/\s@]+)@",
        r"(?i)X-Amz-(?:Security-Token|Signature|Credential)=([^&\s]+)",
        r"(?i)\bBearer\s+([A-Za-z0-9._~+/=-]{8,})",
        r"\b((?:AKIA|ASIA)[A-Z0-9]{16})\b",
        r"\b(hf_[A-Za-z0-9]{20,})\b",
    )
)


class SpecError(ValueError):
    """Invalid user input, raised before anything is created, started or paid for: says what is wrong and what to
    change. The launcher's one error type (trainkit/errors.py); defined here so that a family's launcher side
    (training/families.py) raises it without importing the launcher."""


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
        isinstance(cause, (NoRetry, MemoryError, ImportError, SyntaxError))
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
    """`text` with the value of every secret in SECRET_ENV replaced by its name, and credentials of the shapes that
    error messages and logs quote (SECRET_PATTERNS) replaced by `<redacted>`: a cause travels to places more people
    read than a rank's log (a pod's termination message, SageMaker's failure reason, Batch's status reason)."""
    for name in SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 8:  # shorter values would be found in ordinary words
            text = text.replace(value, f"<{name}>")
    for pattern in SECRET_PATTERNS:
        text = pattern.sub(_hide_group, text)
    return text


def _hide_group(match: re.Match) -> str:
    """The match with its first group (the secret) replaced."""
    whole, start = match.group(0), match.start(0)
    return whole[: match.start(1) - start] + "<redacted>" + whole[match.end(1) - start :]


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
    """The last line of a log file that says something (read from its tail: logs grow long), as a terminal shows it
    (after its last carriage return), progress bars passed over, secrets redacted, cut to MESSAGE_CHARS; None when
    it has none or cannot be read. What a process that exits without an exception said last is usually why
    (argparse's "error: ..." line, a `sys.exit` message)."""
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - LAST_LINE_BYTES))
            tail = handle.read()
    except OSError:
        return None
    for line in reversed(tail.decode(errors="replace").split("\n")):
        shown = line.rsplit("\r", 1)[-1].strip()
        if shown and not PROGRESS_BAR.search(shown):
            return redact(shown)[:MESSAGE_CHARS]
    return None


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


def exit_record(code: object) -> dict:
    """The record of a script that called `sys.exit(code)` with a failure, its code as Python turns it into an exit
    status (an integer; anything else is printed and exits 1): the message it exits with, else the last line it wrote
    to stderr. Exit 2 is a usage error (argparse's and click's refusal of an argument): every restart is given the
    same arguments, so it is permanent, as EXIT_NO_RETRY is."""
    status, text = (code, "") if isinstance(code, int) else (1, str(code).strip())
    said = redact(text.splitlines()[0])[:MESSAGE_CHARS] if text else last_line(_log_file())
    cause = f"exited with code {status}" + (f": {said}" if said else "")
    return {**_record("SystemExit", cause, status in (EXIT_USAGE, EXIT_NO_RETRY)), "exit_code": status}


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
    rank's log (when the log can still be written), and ends the process with EXIT_NO_RETRY or 1 at once (a rank
    whose peers hang in a collective must not wait in teardown). SystemExit (a deliberate stop) passes untouched.

    `exits`: a user's script, which ends as `python FILE` would (its atexit handlers and finalizers run), and whose
    `sys.exit(2)` is a failure: a non-zero SystemExit is recorded too and ends the process with its own code, an
    exception with 1, each EXIT_NO_RETRY when permanent."""
    try:
        yield
    except KeyboardInterrupt:
        raise
    except SystemExit as stop:
        if not exits or stop.code in (None, 0):
            raise
        if not isinstance(stop.code, int):
            _say(f"{stop.code}\n")  # what Python prints for such a code; the SystemExit below has a number
        _end(exit_record(stop.code), exits)
    except BaseException as error:
        record = worker_record(error)
        if not isinstance(root_cause(error), NoRetry):  # ours say all there is; others get their traceback
            _say("".join(traceback.format_exception(error)))
        _end({**record, "exit_code": 1}, exits)


def _end(record: dict, exits: bool) -> None:
    """Send the record, say it in one line in the rank's log, and end the process with its code (EXIT_NO_RETRY when
    permanent): at once, or (`exits`) through SystemExit, as the script itself would have ended."""
    send(record)
    retry = "not restarted: a restart would fail the same way" if record["permanent"] else "may be restarted"
    _say(f"error: rank {record['rank']}: {record['cause']} ({retry})\n")
    code = EXIT_NO_RETRY if record["permanent"] else record["exit_code"]
    if exits:
        raise SystemExit(code) from None
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(code)


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
