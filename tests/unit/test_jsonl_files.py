"""The run's JSON-lines files (training/common/files.py): one appender that never leaves a torn line, even when the
volume fills mid-write, and one reader that never fails on one (issue 45: a half line a full disk left made every
start of the run fail). tests/integration/test_jsonl_full_volume.py proves the appender on a real full volume."""

from __future__ import annotations

import ast
import errno
import fcntl
import json
import multiprocessing
import os
import re
import time
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from training.common import files
from training.common.files import EVENTS_FILE, append_event, append_jsonl, read_events, read_jsonl
from training.common.metrics import MetricsSink


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines()


def notes(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]


def test_a_torn_last_line_is_dropped_and_said_once(tmp_path, capsys):
    append_event(tmp_path, "start", step=0)
    append_event(tmp_path, "checkpoint", step=10)
    with (tmp_path / EVENTS_FILE).open("a") as events:
        events.write('{"event": "stop", "st')  # its writer killed mid-append
    for _ in range(3):  # a reader polls
        assert [(e["event"], e["step"]) for e in read_jsonl(tmp_path / EVENTS_FILE)] == [
            ("start", 0),
            ("checkpoint", 10),
        ]
    assert notes(capsys) == [
        f"note: {tmp_path / EVENTS_FILE}: dropped its torn last line (21 bytes): a write cut short (a full volume, "
        "a kill) leaves one; the next append cuts it off"
    ]


def test_a_corrupt_line_in_the_middle_is_skipped_and_named_by_file_and_line_once(tmp_path, capsys):
    """A non-object JSON value is as corrupt as text that does not parse; a blank line is nothing to say."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo\n\n[3]\n{"step": 4}\n   \n' + "[" * 100_000 + '\n{"step": 5}\n')
    for _ in range(2):
        assert [r["step"] for r in read_jsonl(path)] == [1, 4, 5]
    said = notes(capsys)
    assert [line.split(": skipped")[0] for line in said] == [f"note: {path}:{n}" for n in (2, 4, 7)]
    assert "(it holds a list); mend or delete it" in said[1] and "(nested too deep)" in said[2]


def test_a_character_torn_in_two_does_not_fail_the_reader(tmp_path):
    path = tmp_path / EVENTS_FILE
    path.write_bytes(b'{"note": "' + "€".encode()[:-1] + b'"}\n{"step": 2}\n{"note": "' + "€".encode()[:2])
    found = read_jsonl(path)
    assert found[0]["note"].startswith("\ufffd") and found[1:] == [{"step": 2}]


def test_a_missing_file_has_no_records(tmp_path):
    assert read_jsonl(tmp_path / "metrics.jsonl") == []


def test_the_next_append_cuts_a_torn_tail_off_instead_of_gluing_its_line_to_it(tmp_path):
    """A torn line an older version or a machine that went down left: the next writer's line starts a line."""
    append_event(tmp_path, "start", step=0)
    with (tmp_path / EVENTS_FILE).open("ab") as events:
        events.write('{"event": "stalled", "note": "€'.encode()[:-1])  # cut inside a character, too
    append_event(tmp_path, "resume", step=8)
    append_event(tmp_path, "checkpoint", step=12)
    assert [(e["event"], e["step"]) for e in read_jsonl(tmp_path / EVENTS_FILE)] == [
        ("start", 0),
        ("resume", 8),
        ("checkpoint", 12),
    ]
    assert (tmp_path / EVENTS_FILE).read_bytes().count(b"\n") == 3


def test_a_whole_record_that_lost_only_its_newline_is_read_and_kept_by_the_next_append(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    append_jsonl(path, {"step": 3})
    assert lines_of(path) == ['{"step": 1}', '{"step": 2}', '{"step": 3}']


def short_then_failing(monkeypatch, error: OSError | None) -> list[bytes]:
    """os.write as a filling volume does it: the first write takes half, the next raises `error` (None: takes the
    rest). Returns what reached the file, write by write."""
    real_write, written = files.os.write, []

    def write(descriptor: int, data: bytes) -> int:
        if written and error is not None:
            raise error
        part = bytes(data[: len(data) // 2] if not written else data)
        written.append(part)
        return real_write(descriptor, part)

    monkeypatch.setattr(files.os, "write", write)
    return written


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_write_the_volume_cuts_short_is_cut_back_and_its_error_raised_unchanged(tmp_path, monkeypatch, code):
    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, {"step": 1})
    before = path.read_bytes()
    error = OSError(code, "No space left on device")
    written = short_then_failing(monkeypatch, error)
    with pytest.raises(OSError) as raised:
        append_jsonl(path, {"step": 2, "loss": 1.5})
    assert raised.value is error  # failure.py classifies it by its errno, doing() adds what the run was doing
    assert len(written) == 1 and written[0]  # part of the line did reach the file ...
    assert path.read_bytes() == before  # ... and is gone again


def test_a_short_write_goes_on_with_the_rest(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    written = short_then_failing(monkeypatch, None)
    append_jsonl(path, {"step": 1, "loss": 2.5})
    assert len(written) == 2 and read_jsonl(path) == [{"step": 1, "loss": 2.5}]


def test_a_failed_write_after_mending_a_torn_tail_leaves_the_tail_cut_and_nothing_of_its_own(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo')

    def full(descriptor: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "write", full)
    with pytest.raises(OSError):
        append_jsonl(path, {"step": 2})
    assert path.read_text() == '{"step": 1}\n'


def test_nan_is_refused_before_the_file_is_touched(tmp_path):
    with pytest.raises(ValueError, match="JSON compliant"):
        append_jsonl(tmp_path / "metrics.jsonl", {"step": 1, "loss": float("nan")})
    assert not (tmp_path / "metrics.jsonl").exists()


def test_events_are_fsynced_and_metrics_lines_are_not(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(files.os, "fsync", synced.append)
    append_jsonl(tmp_path / "metrics.jsonl", {"step": 1})
    assert synced == []
    append_event(tmp_path, "start", step=0)
    assert len(synced) == 1


def test_appenders_go_on_without_a_lock_where_the_file_system_has_none(tmp_path, monkeypatch):
    """Lustre mounted without `flock` answers ENOSYS, NFS without its lock service ENOLCK."""

    def no_locks(descriptor: int, operation: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(files.fcntl, "flock", no_locks)
    append_jsonl(tmp_path / "metrics.jsonl", {"step": 1})
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1}]


def test_an_appender_that_cannot_get_the_lock_in_time_touches_only_its_own_line(tmp_path, monkeypatch):
    """Another appender froze holding the lock (SIGSTOP, a lost Lustre client): after LOCK_WAIT_S this one appends
    anyway, as the watchdog's own event must, and without the lock it cuts nothing: a torn tail gets a newline
    before the line (the reader then skips it), a write cut short stays for the reader to drop."""
    path = tmp_path / EVENTS_FILE
    append_event(tmp_path, "start", step=0)
    with path.open("ab") as torn:
        torn.write(b'{"event": "sta')
    holder = os.open(path, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another open file: another holder, even in this process
    monkeypatch.setattr(files, "LOCK_WAIT_S", 0.05)
    try:
        started = time.monotonic()
        append_event(tmp_path, "stalled", step=3, wait=files.LOCK_WAIT_S)
        assert time.monotonic() - started < 5
    finally:
        os.close(holder)
    assert path.read_bytes().count(b"\n") == 3 and b'{"event": "sta\n' in path.read_bytes()
    assert [e["event"] for e in read_jsonl(path)] == ["start", "stalled"]


def test_processes_appending_at_once_leave_only_whole_lines(tmp_path):
    """Four processes, a torn tail to mend between them, 200 lines each: every line whole, none lost."""
    path = tmp_path / EVENTS_FILE
    path.write_bytes(b'{"event": "torn')
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_append_many, args=(path, writer, 200)) for writer in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=60)
    assert [writer.exitcode for writer in writers] == [0, 0, 0, 0]
    found = sorted((r["writer"], r["n"]) for r in read_jsonl(path))
    assert found == [(w, n) for w in range(4) for n in range(200)]
    assert path.read_bytes().count(b"\n") == 800  # the torn tail was cut, not glued


def _append_many(path: Path, writer: int, count: int) -> None:
    for n in range(count):
        append_jsonl(path, {"writer": writer, "n": n, "pad": "x" * (n % 97)})


def test_truncate_after_keeps_the_whole_lines_up_to_the_step_and_drops_a_torn_tail(tmp_path):
    sink = MetricsSink(tmp_path, {"run_id": "r"}, is_main=True, port=None)
    for step in range(1, 6):
        sink.log_step({"step": step, "loss": 1.0 / step, "time": float(step)})
    with sink.jsonl.open("a") as metrics:
        metrics.write('{"step": 6, "loss": 0.1')  # the volume filled mid-line
    sink.truncate_after(3)
    assert lines_of(sink.jsonl) == [json.dumps({"step": s, "loss": 1.0 / s, "time": float(s)}) for s in (1, 2, 3)]
    assert sink.jsonl.read_text().endswith("\n")


def test_the_vision_copys_manifest_reads_past_a_torn_line_and_appends_whole_ones(tmp_path):
    from training.vision.prep import MANIFEST, Manifest, S3Object

    path = tmp_path / MANIFEST
    Manifest(path).record(S3Object("train/a.JPEG", "a.JPEG", 10, "e1"))
    with path.open("a") as manifest:
        manifest.write('{"key": "train/b.JPEG", "si')
    again = Manifest(path)
    assert again.done == {"train/a.JPEG": (10, "e1")}
    again.record(S3Object("train/b.JPEG", "b.JPEG", 20, "e2"))
    assert Manifest(path).done == {"train/a.JPEG": (10, "e1"), "train/b.JPEG": (20, "e2")}


def test_a_runs_events_are_its_file_and_each_nodes_own_in_time_order(tmp_path, monkeypatch):
    """Where each host has its own copy of the run folder (SageMaker), a host's agent appends to events.<host>.jsonl
    so the hosts' copies do not replace each other's in S3; the run's events are all of them, by time."""
    from trainkit.run.agent import events_file

    ticks = iter(range(100, 200))
    monkeypatch.setattr("training.common.files.time.time", lambda: float(next(ticks)))
    append_event(tmp_path, "start", step=0)
    monkeypatch.setenv("TRAINKIT_CHECKPOINT_HOST", "algo-2")
    append_event(tmp_path, "stalled", file=events_file(), step=5)
    append_event(tmp_path, "resume", step=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.algo-2.jsonl", EVENTS_FILE]
    assert [e["event"] for e in read_events(tmp_path)] == ["start", "stalled", "resume"]
    monkeypatch.delenv("TRAINKIT_CHECKPOINT_HOST")
    assert events_file() == EVENTS_FILE  # one run folder for every node: one file
    assert read_events(tmp_path / "none") == []


# One appender and one reader: no other module of the product (or the tests' helpers) parses lines of JSON or opens a
# file to append. The files below do, and what they read or append is not a run's JSON-lines file.
THE_ONE_MODULE = "training/common/files.py"
CHECKED = ("trainkit", "training", "tests/helpers")
NOT_A_RUNS_JSON_LINES = {
    ("trainkit/services/process.py", "appends"): "a service's console output, plain text",
    ("tests/helpers/kube_api.py", "appends"): "an emulated container's console output, plain text",
    ("tests/helpers/fake_buildah.py", "appends"): "a test double's record of its calls, read once it has exited",
    ("training/text/records.py", "parses"): "a user's dataset: a bad line is a DataError naming it, never skipped",
}
LINE_SOURCES = {"splitlines", "readlines"}
APPEND_MODE = re.compile(r"[rwxbt+]*a[rwxbt+]*")


def own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a module or a function, less those of the functions defined in it (their names are their own)."""
    found, stack = [], list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        found.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            stack.extend(ast.iter_child_nodes(node))
    return found


def is_open(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and called(node) in ("open", "fdopen")


def called(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def line_names(nodes: list[ast.AST]) -> set[str]:
    """Names bound to an open file or to a file's lines: `with path.open() as f`, `f = open(...)`,
    `lines = text.splitlines() if ... else []`."""
    names = set()
    for node in nodes:
        if isinstance(node, ast.withitem) and is_open(node.context_expr) and isinstance(node.optional_vars, ast.Name):
            names.add(node.optional_vars.id)
        elif isinstance(node, ast.Assign) and (is_open(node.value) or has_lines(node.value)):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


def has_lines(node: ast.AST) -> bool:
    return any(isinstance(part, ast.Call) and called(part) in LINE_SOURCES for part in ast.walk(node))


def reads_lines(iterable: ast.AST, names: set[str]) -> bool:
    """An iteration over the lines of a file or a text: `text.splitlines()`, `handle.readlines()`, an open file,
    a name bound to one of those."""
    return has_lines(iterable) or any(
        is_open(node) or (isinstance(node, ast.Name) and node.id in names) for node in ast.walk(iterable)
    )


def is_json_loads(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    if isinstance(node.func, ast.Attribute):
        return node.func.attr == "loads" and getattr(node.func.value, "id", "") == "json"
    return getattr(node.func, "id", "") == "loads"


def line_parsers(source: str) -> list[int]:
    """Lines that call json.loads in a loop or a comprehension over the lines of a file or a text."""
    tree = ast.parse(source)
    found = set()
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]:
        nodes = own_nodes(scope)
        names = line_names(nodes)
        for node in nodes:
            if isinstance(node, ast.For | ast.AsyncFor):
                loops = [(node.iter, node.body)]
            elif isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
                loops = [(generator.iter, [node]) for generator in node.generators]
            else:
                continue
            for iterable, body in loops:
                if reads_lines(iterable, names):
                    found |= {call.lineno for part in body for call in ast.walk(part) if is_json_loads(call)}
    return sorted(found)


def appenders(source: str) -> list[int]:
    """Lines that open a file to append: a mode with "a" (open, Path.open, os.fdopen) or os.O_APPEND."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "O_APPEND":
            found.add(node.lineno)
        elif is_open(node):
            modes = [*node.args, *(keyword.value for keyword in node.keywords if keyword.arg == "mode")]
            if any(isinstance(m, ast.Constant) and APPEND_MODE.fullmatch(str(m.value)) for m in modes):
                found.add(node.lineno)
    return sorted(found)


def jsonl_handling_outside_files_py(root: Path) -> dict[tuple[str, str], list[int]]:
    """(file, "parses" or "appends") -> its lines, for every .py file under CHECKED in `root` but THE_ONE_MODULE."""
    found = {}
    for folder in CHECKED:
        for path in sorted((root / folder).rglob("*.py")):
            name = str(path.relative_to(root))
            if name == THE_ONE_MODULE:
                continue
            source = path.read_text()
            for kind, lines in (("parses", line_parsers(source)), ("appends", appenders(source))):
                if lines:
                    found[(name, kind)] = lines
    return found


def test_only_files_py_parses_or_appends_json_lines():
    """Two appenders or two readers of one file drift apart: a second one would not cut its torn line back, or would
    fail on one (issue 45). Use append_jsonl and read_jsonl; a file that is not a run's JSON lines goes in
    NOT_A_RUNS_JSON_LINES with its reason."""
    found = jsonl_handling_outside_files_py(REPO)
    assert {place: lines for place, lines in found.items() if place not in NOT_A_RUNS_JSON_LINES} == {}
    assert sorted(set(NOT_A_RUNS_JSON_LINES) - set(found)) == []  # an entry whose file no longer does it goes


def test_the_json_lines_check_finds_parsers_and_appenders():
    source = """
import json, os
from pathlib import Path

def truncate_after(jsonl, step):
    return [line for line in jsonl.read_text().splitlines() if line and json.loads(line)["step"] <= step]

def read(metrics, with_records):
    lines = metrics.read_text().splitlines() if with_records else []
    return [json.loads(line) for line in lines if line]

def manifest(path):
    with path.open() as handle:
        for line in handle:
            entry = json.loads(line)
    handle = path.open("a")
    with open(path, mode="ab") as out:
        pass
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND)

def fine(path):
    with path.open("w") as out:
        out.write(json.dumps({}))
    return json.loads(path.read_text()), [json.loads(text) for text in path.glob("*.json")]
"""
    assert line_parsers(source) == [6, 10, 15]
    assert appenders(source) == [16, 17, 19]
