"""The stall watchdog: a rank whose step stops advancing while its process stays alive is found, shown and
ended, so the job restarts from its last checkpoint instead of holding its GPUs forever.

It runs inside each node's torchrun agent (trainkit/run/agent.py), outside the ranks, so it still acts when a
rank's main thread is blocked where no Python runs (a collective whose peer never arrives: gloo's and FSDP2's
reduce-scatter were seen waiting far past --collective-timeout), and on every target alike (the local launcher,
an EKS pod, a SageMaker host, a Batch node all start that agent). It reads the ranks' heartbeat files
(training/common/heartbeat.py) and gives each rank an allowance:

- a step: STALL_FACTOR x the median of the rank's step times so far, at least MIN_STALL_S; or `--stall-timeout`
  seconds when the job sets it. Ten times the median is far outside a healthy job's spread (data waits, garbage
  collection, logging) while a stall of a 10 s step still ends in under two minutes; the minimum keeps a job of
  sub-second steps from being ended by one slow moment of a shared file system or a rendezvous blip.
- the first steps of every process (until MIN_TIMED steps are timed): at least FIRST_STEPS_S, whatever the job sets:
  they include compilation, CUDA graph capture, the first batches' reads and FSDP's lazy initialisation.
- a checkpoint, an evaluation or the final export: at least SLOW_PHASE_S, or STALL_FACTOR x the longest one the
  rank did before.

Past its allowance the agent asks every rank of the node for its stacks (faulthandler, into each rank's log), reads
where each rank's main thread is, records a `stalled` event and the cause for `invoke status`, and kills the
node's ranks: torchrun counts that as a failure of the group, restarts it from the last checkpoint while
--max-restarts allows, and else ends the job as failed with that cause.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from training.common.files import read_events
from training.common.heartbeat import DUMP_SIGNAL, PHASES

STALL_FACTOR = 10
MIN_STALL_S = 60.0
FIRST_STEPS_S = 600.0
SLOW_PHASE_S = 600.0
MIN_TIMED = 3
LOOK_EVERY_S = 1.0
"""How often the agent reads the beats (its own monitor loop runs every 0.1 s)."""
DUMP_WAIT_S = 2.0
"""How long the ranks get to write their stacks before they are killed (faulthandler writes at once)."""
SLOW_PHASES = tuple(phase for phase in PHASES if phase != "step")
COLLECTIVE_PATH = "torch/distributed/"
"""A main thread whose innermost frame is in torch.distributed waits in a collective (or its wait)."""
STATES = {"T": "stopped by a signal", "t": "stopped by a debugger"}
GONE = "exited before its stacks were read"
PEER_WAIT_S = LOOK_EVERY_S + DUMP_WAIT_S + 1.0
"""How long a node whose ranks all waited for a peer elsewhere waits for that node's watchdog to name the rank."""
SAME_STALL_S = 10.0
"""Two nodes' findings this close in time are one stall: each node's watchdog looks every LOOK_EVERY_S and gives the
ranks DUMP_WAIT_S for their stacks, and a collective broken by a peer's kill fails at once."""


@dataclass
class Beat:
    step: int
    phase: str
    time: float
    pid: int | None = None
    thread: int | None = None
    dumps: bool = False
    median_s: float | None = None
    timed: int = 0


def read_beat(path: Path) -> Beat | None:
    """A rank's last beat: trainkit's JSON, or a bare step number written by a user's script (its time: the file's)."""
    try:
        text = path.read_text().strip()
        stamp = path.stat().st_mtime
    except OSError:
        return None
    with contextlib.suppress(ValueError):
        data = json.loads(text)
        if isinstance(data, dict):
            median = data.get("median_s")
            return Beat(
                int(data["step"]),
                str(data.get("phase", "step")),
                float(data["time"]),
                data.get("pid"),
                data.get("thread"),
                bool(data.get("dumps")),
                float(median) if median else None,
                int(data.get("timed") or 0),
            )
        if isinstance(data, int | float):
            return Beat(int(data), "step", stamp)
    return Beat(-1, "step", stamp) if text == "" else None


@dataclass
class RankWatch:
    """What the agent has seen of one rank since its process started."""

    last: Beat
    durations: deque = field(default_factory=lambda: deque(maxlen=100))
    """Seconds per step between two beats the agent saw (it looks once a second: one entry may cover many steps)."""
    timed_steps: int = 0
    longest: dict[str, float] = field(default_factory=dict)

    def see(self, beat: Beat) -> None:
        last = self.last
        if (beat.step, beat.phase, beat.time) == (last.step, last.phase, last.time):
            return
        if last.phase == beat.phase == "step" and beat.step > last.step:
            self.durations.append((beat.time - last.time) / (beat.step - last.step))
            self.timed_steps += beat.step - last.step
        if last.phase in SLOW_PHASES and beat.phase != last.phase:
            self.longest[last.phase] = max(self.longest.get(last.phase, 0.0), beat.time - last.time)
        self.last = beat

    def allowance(self, stall_timeout: float | None) -> tuple[float, str]:
        """(seconds, why) this rank may spend in what it does now."""
        phase = self.last.phase
        if phase in SLOW_PHASES:
            longest = self.longest.get(phase, 0.0)
            return max(SLOW_PHASE_S, STALL_FACTOR * longest), f"a {phase}: at least {SLOW_PHASE_S:.0f} s"
        beat = self.last
        if max(self.timed_steps, beat.timed) < MIN_TIMED:
            return max(FIRST_STEPS_S, stall_timeout or 0.0), f"a process's first steps: at least {FIRST_STEPS_S:.0f} s"
        if stall_timeout:
            return float(stall_timeout), "--stall-timeout"
        # the rank's own median where it reports one (a user's file heartbeat does not): the agent's looks once a
        # second and cannot separate a checkpoint from the steps around it
        median = beat.median_s or statistics.median(self.durations)
        seconds = max(MIN_STALL_S, STALL_FACTOR * median)
        return seconds, f"{STALL_FACTOR} x the median step of {median:.2f} s, at least {MIN_STALL_S:.0f} s"


@dataclass
class Stalled:
    """A rank past its allowance: when the agent looked, and what every rank of the node had last said."""

    rank: int
    seconds: float
    allowance: float
    why: str
    beats: dict[int, Beat]


class Watchdog:
    """The beats of one node's ranks, read at most every LOOK_EVERY_S."""

    def __init__(self, directory: Path, stall_timeout: float | None = None, clock=time.time):
        self.directory = Path(directory)
        self.stall_timeout = stall_timeout
        self.clock = clock
        self.ranks: dict[int, RankWatch] = {}
        self._looked = float("-inf")

    def reset(self) -> None:
        """A new round of workers: nothing from the last one counts (its files are removed)."""
        self.ranks.clear()
        for path in self.directory.glob("*"):
            path.unlink(missing_ok=True)

    def look(self, force: bool = False) -> Stalled | None:
        now = self.clock()
        if not force and now - self._looked < LOOK_EVERY_S:
            return None
        self._looked = now
        for path in self.directory.glob("rank-*"):
            beat = read_beat(path)
            if beat is None or not path.name[5:].isdigit():
                continue
            rank = int(path.name[5:])
            if rank in self.ranks:
                self.ranks[rank].see(beat)
            else:
                self.ranks[rank] = RankWatch(beat)
        late = []
        for rank, watch in sorted(self.ranks.items()):
            seconds = now - watch.last.time
            allowance, why = watch.allowance(self.stall_timeout)
            if seconds > allowance:
                late.append((seconds - allowance, Stalled(rank, seconds, allowance, why, {})))
        if not late:
            return None
        stalled = max(late, key=lambda item: item[0])[1]
        stalled.beats = {rank: watch.last for rank, watch in self.ranks.items()}
        return stalled


# ------------------------------------------------------------------ what the ranks were doing


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
    return text + "; every rank's stacks are in its log"


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
                "permanent": False,
            }
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)
