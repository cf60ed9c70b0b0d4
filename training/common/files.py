"""Publishing files that several processes (or pods on one shared volume) may write at once, and the one appender and
the one reader of the run's JSON-lines files (append_jsonl, read_jsonl)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path


def tmp_sibling(path: Path) -> Path:
    """A private name beside `path`: host and a random part, since pids repeat across containers."""
    return path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{uuid.uuid4().hex[:8]}")


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable (the directory's own metadata)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def publish_text(path: Path, text: str) -> Path:
    """Write `text` to `path` atomically and durably: readers see the old file or the whole new one, never
    a part, and once this returns the new one survives the machine (or the pod) going away."""
    return publish_bytes(path, text.encode())


def publish_bytes(path: Path, data: bytes) -> Path:
    """publish_text for bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_sibling(path)
    try:
        with tmp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full volume: no half-written sibling left behind
        raise
    fsync_dir(path.parent)
    return path


EVENTS_FILE = "events.jsonl"


def node_events_file(node: str) -> str:
    """Where a node's agent appends its events when the nodes' run folders are not one folder but copies synced to
    one place (SageMaker's hosts: each host's copy of events.jsonl would replace the others' in S3)."""
    return f"events.{node}.jsonl"


def append_event(run_dir: Path, kind: str, *, file: str = EVENTS_FILE, **fields) -> None:
    """One line of the run's events.jsonl ({"event": kind, "time": ..., **fields}), on disk when this returns. Its
    writers (rank 0, the launcher, a node's agent) each append whole lines (append_jsonl). `file`: another of the
    run's event files (node_events_file)."""
    append_jsonl(run_dir / file, {"event": kind, "time": time.time(), **fields}, durable=True)


# Errors of flock(2) on a file system that has no locks (Lustre mounted without `flock`, NFS without its lock
# service): appenders then go unlocked, and touch no byte but their own line's.
NO_LOCKS = frozenset({errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP})
LOCK_WAIT_S = 5.0
"""How long an appender waits for another's lock (held for one write: microseconds, unless its holder froze, was
SIGSTOPped or lost its Lustre client) before it appends unlocked: the stall watchdog's own event must not wait on a
rank it is about to end."""
TAIL_BLOCK = 64 * 1024


class JsonlAppender:
    """Appends whole lines to one JSON-lines file (made if missing), or changes nothing (see append_jsonl). Holds the
    file open between lines for a writer that appends many (the vision copy's manifest), `locked=False` where it is
    the file's only writer. A context manager; `close` when done."""

    def __init__(self, path: Path, *, locked: bool = True, durable: bool = False):
        self.locked, self.durable = locked, durable
        self.descriptor = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)

    def append(self, record: dict) -> None:
        """`record` as one line. NaN and Infinity are refused (ValueError): they are not JSON."""
        self.append_line(_line(record).encode())

    def append_line(self, line: bytes) -> None:
        """One serialised record (`_line`), with its newline."""
        alone = not self.locked or _lock(self.descriptor)
        try:
            _write_all(self.descriptor, _mend_tail(self.descriptor, cut=alone) + line, cut=alone)
        finally:
            if self.locked and alone:
                fcntl.flock(self.descriptor, fcntl.LOCK_UN)
        if self.durable:
            os.fsync(self.descriptor)  # after the lock: the next appender need not wait for the disk

    def close(self) -> None:
        os.close(self.descriptor)

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def append_jsonl(path: Path, record: dict, *, durable: bool = False) -> None:
    """Append `record` to the JSON-lines file `path` (made if missing) as one whole line, or change nothing.

    The line goes in one write on an O_APPEND descriptor (continued if the kernel takes part of it), so concurrent
    appenders never interleave. A write that fails part-way (a full volume, a quota, a file-size limit) is cut back
    to where its own bytes started and its OSError raised as it came: a full volume leaves no half line that would
    make the file unreadable at the next start. A torn last line already there (an older writer's, a machine that
    went down mid-write) is cut off first, so the new line is not glued onto it. Appenders hold an exclusive flock
    while they look at the tail and write, so one never cuts another's line; where there is no lock (a file system
    without locks, a holder that did not let go within LOCK_WAIT_S) nothing but this line's bytes is touched: a torn
    tail gets a newline before the line instead, and a write cut short stays as a torn line, which read_jsonl drops.
    `durable`: fsynced before this returns (events, which restarts read back)."""
    line = _line(record).encode()  # a record that is not JSON is refused before the file is touched
    with JsonlAppender(path, durable=durable) as appender:
        appender.append_line(line)


def publish_jsonl(path: Path, records: list[dict]) -> Path:
    """Replace the JSON-lines file `path` with `records` at once (publish_text), in append_jsonl's line format."""
    return publish_text(path, "".join(_line(record) for record in records))


def _line(record: dict) -> str:
    return json.dumps(record, allow_nan=False) + "\n"


def _lock(descriptor: int) -> bool:
    """Take the file's exclusive lock, waiting at most LOCK_WAIT_S; False: appending unlocked (see append_jsonl)."""
    deadline, pause = time.monotonic() + LOCK_WAIT_S, 0.001
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        except OSError as error:
            if error.errno not in NO_LOCKS:
                raise
            return False


def _mend_tail(descriptor: int, cut: bool) -> bytes:
    """Make the file end at a line's end before a line is appended; returns what must go before that line. A last
    line without its newline that is a whole record (a write cut just before it) gets one, as read_jsonl keeps
    it; any other is torn, and cut off (`cut`: this appender holds the file alone), else ended with a newline."""
    end = os.lseek(descriptor, 0, os.SEEK_END)
    if end == 0 or os.pread(descriptor, 1, end - 1) == b"\n":
        return b""
    start = _last_line_start(descriptor, end)
    try:
        _record(os.pread(descriptor, end - start, start))
    except ValueError:
        if cut:
            os.ftruncate(descriptor, start)
            return b""
    return b"\n"


def _last_line_start(descriptor: int, end: int) -> int:
    """Where the line that ends at `end` starts: after the newline before it, or at 0."""
    while end > 0:
        start = max(0, end - TAIL_BLOCK)
        newline = os.pread(descriptor, end - start, start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def _write_all(descriptor: int, data: bytes, cut: bool) -> None:
    """`data` at the end of the file, or nothing of it: a short write goes on with the rest; an error cuts off the
    bytes this call wrote (after an O_APPEND write the offset is the end of its own bytes; `cut`: no other appender
    can have written after them) and is raised unchanged."""
    written = 0
    try:
        while written < len(data):
            written += os.write(descriptor, data[written:])
    except OSError:
        if written and cut:
            os.ftruncate(descriptor, os.lseek(descriptor, 0, os.SEEK_CUR) - written)
        raise


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file its writers append to (events.jsonl, metrics.jsonl), in order; none when it
    is missing or cannot be read. Nothing in it makes this fail: a torn last line (a write cut short by a full volume
    or a kill) is dropped, a line in the middle that is not a JSON object is skipped, each said once per process on
    stderr (file and line), and blank lines are passed over."""
    try:
        data = path.read_bytes()
    except OSError:
        return []
    *lines, tail = data.split(b"\n")  # tail: what follows the last newline, empty when the file ends whole
    records = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                records.append(_record(line))
            except ValueError as error:
                _note_once(f"{path}:{number}", f"skipped a line that is not a JSON object ({error}); mend or delete it")
    if tail.strip():
        try:
            records.append(_record(tail))
        except ValueError:
            _note_once(
                f"{path}",
                f"dropped its torn last line ({len(tail)} bytes): a write cut short (a full volume, a kill) leaves "
                "one; the next append cuts it off",
            )
    return records


def _record(line: bytes) -> dict:
    """One line's record; ValueError when it is not a JSON object (a torn character spoils its own line only)."""
    try:
        record = json.loads(line.decode(errors="replace"))
    except RecursionError:  # "[[[[...": damage too, not a reason to fail
        raise ValueError("nested too deep") from None
    if not isinstance(record, dict):
        raise ValueError(f"it holds a {type(record).__name__}")
    return record


_NOTED: set[str] = set()


def _note_once(where: str, what: str) -> None:
    """A reader polls its files: each damaged place is said once per process, not at every read."""
    if where not in _NOTED:
        _NOTED.add(where)
        print(f"note: {where}: {what}", file=sys.stderr, flush=True)


def read_events(run_dir: Path) -> list[dict]:
    """The run's events in time order: events.jsonl and every node's own file (node_events_file)."""
    files = [run_dir / EVENTS_FILE, *sorted(run_dir.glob(node_events_file("*")))]
    records = [record for path in files for record in read_jsonl(path)]
    return sorted(records, key=lambda record: record.get("time", 0)) if len(files) > 1 else records


def publish_rank_files(run_dir: Path, rank: int, files: dict[str, str]) -> None:
    """logs/ranks/<rank>.json: {"stdout": path, "stderr": path} of a global rank's current process, written by the
    torchrun agent that started it (trainkit/run/agent.py), for any workload, when it starts the rank."""
    from training.spec import RANK_LOGS_DIR

    folder = run_dir / "logs" / RANK_LOGS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    publish_text(folder / f"{rank}.json", json.dumps(files) + "\n")
