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
- a checkpoint, an evaluation or the final export: what it has to write at the storage's throughput, with a margin
  (`budgets`: a 70B checkpoint of 847 GB on a 4,800 GiB FSx of 250 MB/s per TiB takes about 12 minutes, so a fixed
  allowance would end every save of a healthy job); never less than SLOW_PHASE_S or `--stall-timeout`, nor than
  STALL_FACTOR x the longest one of its kind the run did before (its `checkpoint` events, so a restart does not
  forget them).

All of it is measured on the node's monotonic clock (the ranks' beats carry theirs): a step of the wall clock (NTP,
a VM's resume) never ends a healthy rank.

Past its allowance the agent asks every rank of the node for its stacks (faulthandler, into each rank's log), reads
where each rank's main thread is, records a `stalled` event and the cause for `invoke status`, and kills the
node's ranks: torchrun counts that as a failure of the group, restarts it from the last checkpoint while
--max-restarts allows, and else ends the job as failed with that cause. A rank that stalls again at the step where the
run stalled before (a deterministic deadlock: every restart restores the checkpoint and hangs at the same place) ends
the job at once, with a cause that says so.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from training.common.files import read_events
from training.common.heartbeat import SLOW_PHASES

STALL_FACTOR = 10
MIN_STALL_S = 60.0
FIRST_STEPS_S = 600.0
SLOW_PHASE_S = 600.0
"""The least a checkpoint, an evaluation or the export gets, whatever it writes: opening and publishing files on a
shared file system, a collective to agree on the step, a small model's whole save."""
WRITE_MARGIN = 1.5
"""A phase's bytes at the storage's throughput, times this: the other ranks' and jobs' traffic on the same file
system, and a throughput that was measured on one file or declared for the whole system."""
MIN_TIMED = 3
LOOK_EVERY_S = 1.0
"""How often the agent reads the beats (its own monitor loop runs every 0.1 s)."""


@dataclass
class Beat:
    step: int
    phase: str
    time: float | None
    """When, on the node's monotonic clock (trainkit's beats say it; for a bare step number the agent sets when it saw
    the file change)."""
    pid: int | None = None
    thread: int | None = None
    dumps: bool = False
    median_s: float | None = None
    timed: int = 0
    stamp: object = None
    """What tells one beat from the next (the beat's own times, or the file's content and modification time)."""


def read_beat(path: Path) -> Beat | None:
    """A rank's last beat: trainkit's JSON, or a bare step number written by a user's script."""
    try:
        text = path.read_text().strip()
        changed = path.stat().st_mtime_ns
    except OSError:
        return None
    with contextlib.suppress(ValueError, KeyError, TypeError):
        data = json.loads(text)
        if isinstance(data, dict):
            median, monotonic = data.get("median_s"), data.get("monotonic")
            return Beat(
                int(data["step"]),
                str(data.get("phase", "step")),
                float(monotonic) if monotonic is not None else None,
                data.get("pid"),
                data.get("thread"),
                bool(data.get("dumps")),
                float(median) if median else None,
                int(data.get("timed") or 0),
                (monotonic, data.get("time"), data["step"], data.get("phase")),
            )
        if isinstance(data, int | float):
            return Beat(int(data), "step", None, stamp=(text, changed))
    return Beat(-1, "step", None, stamp=(text, changed)) if text == "" else None


@dataclass(frozen=True)
class Budget:
    """What a slow phase may take, and why."""

    seconds: float
    why: str


def budgets(
    stall_timeout: float | None,
    phase_bytes: dict[str, int] | None = None,
    mb_s: float | None = None,
    hosts: int = 1,
) -> dict[str, Budget]:
    """Each slow phase's allowance before the run's own history counts: what the run writes in it (`phase_bytes`: a
    checkpoint; at the end the last checkpoint and the export) at `mb_s` (the storage's write throughput, MB/s)
    times WRITE_MARGIN, at least SLOW_PHASE_S and --stall-timeout. A checkpoint's parts are written by all ranks at
    once: with `hosts` > 1 each host writes its part to a volume of its own at `mb_s`; the export is rank 0's alone."""
    floor = max(SLOW_PHASE_S, float(stall_timeout or 0))
    floor_why = "--stall-timeout" if floor > SLOW_PHASE_S else f"at least {SLOW_PHASE_S:.0f} s"
    found = {}
    sharded = (phase_bytes or {}).get("checkpoint", 0)
    for phase in SLOW_PHASES:
        size = (phase_bytes or {}).get(phase, 0)
        alone = max(size - sharded, 0) if phase == "export" else 0  # the export: one host's write after the save
        writing = ((size - alone) / hosts + alone) / (mb_s * 1e6) * WRITE_MARGIN if size and mb_s else 0.0
        if writing > floor and hosts > 1:
            one = f" and {_amount(alone)} on one" if alone else ""
            why = f"{_amount(size - alone)} over {hosts} hosts{one}, at {mb_s:,.4g} MB/s each x {WRITE_MARGIN:g}"
            found[phase] = Budget(writing, why)
        elif writing > floor:
            found[phase] = Budget(writing, f"{_amount(size)} at {mb_s:,.4g} MB/s x {WRITE_MARGIN:g}")
        else:
            found[phase] = Budget(floor, floor_why)
    return found


def _amount(size: float) -> str:
    return f"{size / 1e9:,.1f} GB" if size >= 1e9 else f"{size / 1e6:,.1f} MB"


def describe_budget(phase: str, budget: Budget) -> str:
    """`checkpoint allowance 31 min: 847.0 GB at 500 MB/s x 1.5`, for the launcher's notes."""
    minutes = budget.seconds / 60
    return f"{phase} allowance {minutes:,.0f} min: {budget.why}"


def seeded_longest(run_dir: Path | None) -> dict[str, float]:
    """The longest checkpoint the run recorded (its `checkpoint` events, with the seconds each took), so that a
    restarted round, whose ranks have not saved yet, still allows for it."""
    if run_dir is None:
        return {}
    seconds = [
        float(event["seconds"])
        for event in read_events(Path(run_dir))
        if event.get("event") == "checkpoint" and isinstance(event.get("seconds"), int | float)
    ]
    return {"checkpoint": max(seconds)} if seconds else {}


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
        if beat.stamp == last.stamp:
            return
        if last.phase == beat.phase == "step" and beat.step > last.step:
            self.durations.append((beat.time - last.time) / (beat.step - last.step))
            self.timed_steps += beat.step - last.step
        if last.phase in SLOW_PHASES and beat.phase != last.phase:
            self.longest[last.phase] = max(self.longest.get(last.phase, 0.0), beat.time - last.time)
        self.last = beat

    def allowance(self, stall_timeout: float | None, planned: dict[str, Budget] | None = None) -> tuple[float, str]:
        """(seconds, why) this rank may spend in what it does now; `planned`: the slow phases' budgets."""
        phase = self.last.phase
        if phase in SLOW_PHASES:
            budget = (planned or {}).get(phase) or budgets(stall_timeout)[phase]
            longest = self.longest.get(phase, 0.0)
            if STALL_FACTOR * longest > budget.seconds:
                return STALL_FACTOR * longest, f"a {phase}: {STALL_FACTOR} x the run's longest, {longest:.0f} s"
            return budget.seconds, f"a {phase}: {budget.why}"
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

    def __init__(
        self,
        directory: Path,
        stall_timeout: float | None = None,
        clock=time.monotonic,
        planned: dict[str, Budget] | None = None,
        run_dir: Path | None = None,
        scale: float = 1.0,
    ):
        """`clock`: the node's monotonic clock, which the ranks' beats use too; `planned`: the slow phases' budgets
        (`budgets`); `run_dir`: where the run's events are (its checkpoints' seconds); `scale`: how many of the
        allowances' seconds one second of `clock` counts for (1, but in tests that run a long phase in scaled
        time)."""
        self.directory = Path(directory)
        self.stall_timeout = stall_timeout
        self.clock = clock
        self.planned = planned or budgets(stall_timeout)
        self.run_dir = run_dir
        self.scale = scale
        self.ranks: dict[int, RankWatch] = {}
        self.seeded: dict[str, float] = {}
        self._looked = float("-inf")

    def reset(self) -> None:
        """A new round of workers: nothing from the last one counts (its files are removed) but the run's recorded
        checkpoint times."""
        self.ranks.clear()
        for path in self.directory.glob("*"):
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.seeded = {phase: s * self.scale for phase, s in seeded_longest(self.run_dir).items()}

    def _read(self, path: Path, now: float) -> Beat | None:
        beat = read_beat(path)
        if beat is None:
            return None
        if beat.time is None:  # a bare step number: when this agent saw it change
            known = self.ranks.get(int(path.name[5:]))
            beat.time = known.last.time if known is not None and known.last.stamp == beat.stamp else now
        else:
            beat.time *= self.scale
        if beat.median_s is not None:
            beat.median_s *= self.scale
        return beat

    def look(self, force: bool = False) -> Stalled | None:
        now = self.clock() * self.scale
        if not force and now - self._looked < LOOK_EVERY_S * self.scale:
            return None
        self._looked = now
        for path in self.directory.glob("rank-*"):
            if not path.name[5:].isdigit():
                continue
            beat = self._read(path, now)
            if beat is None:
                continue
            rank = int(path.name[5:])
            if rank in self.ranks:
                self.ranks[rank].see(beat)
            else:
                self.ranks[rank] = RankWatch(beat, longest=dict(self.seeded))
        late = []
        for rank, watch in sorted(self.ranks.items()):
            seconds = now - watch.last.time
            allowance, why = watch.allowance(self.stall_timeout, self.planned)
            if seconds > allowance:
                late.append((seconds - allowance, Stalled(rank, seconds, allowance, why, {})))
        if not late:
            return None
        stalled = max(late, key=lambda item: item[0])[1]
        stalled.beats = {rank: watch.last for rank, watch in self.ranks.items()}
        return stalled
