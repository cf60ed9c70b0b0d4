"""Publishing files that several processes (or pods on one shared volume) may write at once, and reading the run's
JSON-lines files back."""

from __future__ import annotations

import contextlib
import json
import os
import socket
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
    writers (rank 0, the launcher, a node's agent) each append whole lines. `file`: another of the run's event files
    (node_events_file)."""
    with (run_dir / file).open("a") as handle:
        handle.write(json.dumps({"event": kind, "time": time.time(), **fields}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file its writers append to (events.jsonl, metrics.jsonl), in order; none when it
    is missing or cannot be read. A line that is not a whole JSON object is skipped: the last one may be torn (being
    written now, or its writer killed mid-append), and a line appended after a torn one joins it."""
    try:
        text = path.read_text(errors="replace")  # a torn multi-byte character spoils its own line only
    except OSError:
        return []
    records = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records


def read_events(run_dir: Path) -> list[dict]:
    """The run's events in time order: events.jsonl and every node's own file (node_events_file)."""
    files = [run_dir / EVENTS_FILE, *sorted(run_dir.glob(node_events_file("*")))]
    records = [record for path in files for record in read_jsonl(path)]
    return sorted(records, key=lambda record: record.get("time", 0)) if len(files) > 1 else records


def publish_rank_files(run_dir: Path, rank: int, files: dict[str, str]) -> None:
    """logs/ranks/<rank>.json: {"stdout": path, "stderr": path} of a global rank's current process, written by the
    torchrun agent that started it (trainkit/run/agent.py), for any workload, when it starts the rank."""
    from .job import RANK_LOGS_DIR

    folder = run_dir / "logs" / RANK_LOGS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    publish_text(folder / f"{rank}.json", json.dumps(files) + "\n")
