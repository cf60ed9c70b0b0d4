"""A stall, once the watchdog (trainkit/run/watchdog.py) found one: where each of the node's ranks was (the stacks they
dump into their logs on DUMP_SIGNAL, or their process state), the cause in one line for the console and `invoke
status`, and the run's other findings: another node's, when this node's ranks only waited for that node's hung rank;
an earlier one at the same step, when a restart repeated it.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from training.common.files import read_events
from training.common.heartbeat import DUMP_SIGNAL
from trainkit.run.watchdog import LOOK_EVERY_S, Stalled

DUMP_WAIT_S = 2.0
"""How long the ranks get to write their stacks before they are killed (faulthandler writes at once)."""
COLLECTIVE_PATH = "torch/distributed/"
"""A main thread whose innermost frame is in torch.distributed waits in a collective (or its wait)."""
STATES = {"T": "stopped by a signal", "t": "stopped by a debugger"}
GONE = "exited before its stacks were read"
PEER_WAIT_S = LOOK_EVERY_S + DUMP_WAIT_S + 1.0
"""How long a node whose ranks all waited for a peer elsewhere waits for that node's watchdog to name the rank."""
SAME_STALL_S = 10.0
"""Two nodes' findings this close in time are one stall: each node's watchdog looks every LOOK_EVERY_S and gives the
ranks DUMP_WAIT_S for their stacks, and a collective broken by a peer's kill fails at once."""
REPEATS_TO_END = 2
"""A stall at the step where the run already stalled this many times, less one, ends the job: the first restart
may heal a fault of the moment (a lost packet, a slow disk); the same step again is the job's own."""


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of a process (R, S, D, T, Z ...), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')


def innermost_frame(dump: str, thread: int | None) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost frame of `thread` (the rank's main thread) in a faulthandler dump;
    the last dump in `dump` counts."""
    found, current = None, None
    for line in dump.splitlines():
        header = _THREAD.match(line)
        if header:
            current = int(header.group(1), 16)
            first = True
            continue
        frame = _FRAME.match(line)
        if frame and current is not None and first and (thread is None or current == thread):
            found = (frame["file"], int(frame["line"]), frame["func"])
            first = False
        elif frame:
            first = False
    return found


def where(state: str | None, frame: tuple[str, int, str] | None, dumps: bool) -> tuple[str, bool | None]:
    """(what the rank was doing, whether it waited in a collective: None when unknown)."""
    if state in (None, "Z"):  # a peer's failure ended it meanwhile (its collective broke): it tells nothing
        return GONE, None
    if state in STATES:
        return STATES[state], False
    if frame is None:
        return ("no stack dump came" if dumps else "no stack dump (the script does not use trainkit's heartbeat)"), None
    file, line, func = frame
    short = file.split("site-packages/")[-1]
    if COLLECTIVE_PATH in file:
        return f"waiting in a collective ({short}:{line} in {func})", True
    return f"not in a collective: {short}:{line} in {func}", False


def tail(path: str | None, start: int) -> str:
    if not path:
        return ""
    with contextlib.suppress(OSError), open(path, "rb") as handle:
        handle.seek(start)
        return handle.read().decode(errors="replace")
    return ""


def log_size(path: str | None) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


@dataclass
class Worker:
    rank: int
    pid: int
    log: str | None


def _wait_for_dumps(workers: list[Worker], sizes: dict[int, int], wait_s: float) -> None:
    """Until every asked rank's log has grown and stayed still for a moment (faulthandler writes at once; a stopped
    rank never writes), at most `wait_s`."""
    deadline, still_since, last = time.monotonic() + wait_s, None, None
    while time.monotonic() < deadline:
        now = [log_size(w.log) for w in workers]
        grown = all(
            size > sizes[w.rank] or process_state(w.pid) in ("T", "t", "Z", None)
            for w, size in zip(workers, now, strict=True)
        )
        if grown and now == last:
            if still_since is not None and time.monotonic() - still_since >= 0.2:
                return
            still_since = still_since or time.monotonic()
        else:
            still_since = None
        last = now
        time.sleep(0.05)


def examine(stalled: Stalled, workers: list[Worker], wait_s: float = DUMP_WAIT_S) -> dict:
    """Ask each rank that can dump for its stacks, then say where each one is: the `stalled` event's fields."""
    sizes = {w.rank: log_size(w.log) for w in workers}
    asked = []
    for worker in workers:
        beat = stalled.beats.get(worker.rank)
        if beat is not None and beat.dumps and beat.pid == worker.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, DUMP_SIGNAL)
                asked.append(worker)
    if asked:
        _wait_for_dumps(asked, sizes, wait_s)
    ranks, not_arrived, waiting = {}, [], []
    newest = max((b.step for b in stalled.beats.values()), default=0)
    for worker in workers:
        beat = stalled.beats.get(worker.rank)
        dumps = bool(beat and beat.dumps)
        frame = innermost_frame(tail(worker.log, sizes[worker.rank]), beat.thread if beat else None)
        doing, in_collective = where(process_state(worker.pid), frame, dumps)
        step = beat.step if beat else None
        behind = step is not None and step < newest
        ranks[str(worker.rank)] = {"step": step, "phase": beat.phase if beat else None, "doing": doing}
        if in_collective is False or behind or (beat is None and doing != GONE):
            not_arrived.append(worker.rank)
        elif in_collective:
            waiting.append(worker.rank)
    return {
        "step": min((b.step for b in stalled.beats.values()), default=None),
        "rank": stalled.rank,
        "seconds": round(stalled.seconds, 1),
        "allowance_s": round(stalled.allowance, 1),
        "allowance": stalled.why,
        "ranks": ranks,
        "not_arrived": sorted(not_arrived),
        "in_collective": sorted(waiting),
    }


def cause(report: dict) -> str:
    """The stall in one line, for the console and `invoke status`."""
    text = (
        f"stalled: rank {report['rank']} finished no step for {report['seconds']:.0f} s after step {report['step']} "
        f"(allowed {report['allowance_s']:.0f} s: {report['allowance']})"
    )
    missing = report["not_arrived"]
    if missing:
        described = "; ".join(f"rank {r} {report['ranks'][str(r)]['doing']}" for r in missing)
        text += f"; did not arrive: {described}"
    elif report["in_collective"]:
        text += "; every rank here waits in a collective: the one that did not arrive is on another node"
    text += "; every rank's stacks are in its log"
    if report.get("repeated"):
        text += (
            f"; the run stalled after step {report['step']} before: a hang of the job's own, which a restart repeats"
        )
    return text


def stall_elsewhere(run_dir: Path, failure: dict, wait_s: float = PEER_WAIT_S) -> dict | None:
    """The stall another node's watchdog pinned on one of its ranks, when this node's `failure` (its cause record)
    followed from it: its ranks waited in a collective for that rank (its own watchdog then says the rank is on
    another node, and waits up to `wait_s` for that node's finding), or their collective broke when that node ended
    its ranks. That stall is the job's cause, as a record naming the node that saw it; None when this node's own
    rank hung, or no other node found a hung rank (the run folder is not shared: SageMaker's hosts)."""
    if failure.get("permanent"):
        return None
    here, when = failure.get("node_name"), float(failure.get("time", 0))
    deadline = time.monotonic() + (wait_s if failure.get("stalled") else 0.0)
    while True:
        found = [e for e in read_events(Path(run_dir)) if e.get("event") == "stalled" and e.get("not_arrived")]
        found = sorted((e for e in found if abs(e["time"] - when) <= SAME_STALL_S), key=lambda e: e["time"])
        # The first finding is the hung rank's node's: a later one may name ranks that were failing after its kill.
        if found and found[0].get("node") == here:
            return None
        if found:
            event = found[0]
            return {
                "source": "agent",
                "rank": event["rank"],
                "node_name": event["node"],
                "time": event["time"],
                "cause": cause(event),
                "stalled": True,
                "permanent": bool(event.get("repeated")),
            }
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


def repeated_stall(run_dir: Path | None, step: int | None) -> int:
    """How many earlier rounds of workers of the run stalled at `step`: its `stalled` events at that step before the
    run's last `start` or `resume` event (which the current round's rank 0 wrote when it began), counted once per round
    (the rounds are what lies between two such events: every node of a round records its own finding of one stall,
    and the nodes' agents do not count their attempts alike: an agent restarted for a peer's new round counts none)."""
    if run_dir is None or step is None:
        return 0
    events = read_events(Path(run_dir))
    starts = sorted(float(e.get("time", 0)) for e in events if e.get("event") in ("start", "resume"))
    if not starts:
        return 0
    earlier = [
        float(e.get("time", 0))
        for e in events
        if e.get("event") == "stalled" and e.get("step") == step and float(e.get("time", 0)) < starts[-1]
    ]
    return len({bisect.bisect(starts, when) for when in earlier})
