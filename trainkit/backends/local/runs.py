"""Following and stopping a local run from its folder: `invoke status | logs | stop` for the local target.

What a local run leaves to read: `launcher.json` (the `invoke train` process that owns the job, while
it runs), `launcher.pid` (its torchrun agents), `metrics.jsonl`, `events.jsonl`, `summary.json`,
`logs/ranks/<rank>.json`, where every worker records the files torchrun sends its output to, and after a
failure its cause (`failure.json`, or the state dir's copy when the run's volume was full:
trainkit/run/failures.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from training.common.failure import redact
from training.common.files import append_event, read_events, read_jsonl
from training.common.tracking import TRACKING_FILE
from training.families import family_of
from training.spec import RANK_LOGS_DIR, SPEC_FILE, read_job
from trainkit.backends.base import RunRef
from trainkit.errors import SpecError
from trainkit.run.agent import attempts
from trainkit.run.failures import recorded_failure
from trainkit.run.state import RunState, RunStatus, finished_said, run_summary, stopped_early
from trainkit.run.workload import WORKLOAD_FILE

OWNER_FILE = "launcher.json"
FINISHED_EVENT = "finished"
LAUNCH_EVENT = "launch"
"""The launcher's event when it starts the run's agents, with the command that did it (`invoke status` says it)."""
LOCK_FILE = ".lock"
FOLLOW_POLL_S = 0.5


def _started(pid: int) -> str | None:
    """When a process started (clock ticks since boot, /proc/<pid>/stat field 22), or None when there is
    no such process: with the pid it identifies the process, since pids are reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # fields after the command name start at field 3


def record_owner(run_dir: Path) -> Path:
    """launcher.json: this process (pid, start time, host) owns the run while it runs."""
    path = run_dir / OWNER_FILE
    owner = {"pid": os.getpid(), "started": _started(os.getpid()), "host": os.uname().nodename}
    path.write_text(json.dumps(owner) + "\n")
    return path


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[int]:
    """One writer per run: an exclusive lock on `<run>/.lock` for the job's life, or a refusal naming the
    launcher that holds it. Yields the lock's file descriptor: the torchrun agents inherit it (pass_fds),
    so the run stays locked while any of them lives, even if this launcher is killed first. A lock of a
    launcher that died is free again (the kernel drops it with its last holder); taking such a run over
    is said on the console."""
    absent = [folder for folder in [run_dir, *run_dir.parents] if not folder.exists()]
    created = absent[-1] if absent else None  # the highest folder this call makes
    # A runs folder made here is the user's own: private, as its runs' logs, specs and checkpoints are. One that
    # exists keeps the rights its owner gave it (a team's shared folder stays shared).
    run_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    run_dir.mkdir(exist_ok=True)
    descriptor = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SpecError(_held_by(run_dir)) from None
        previous = _recorded_owner(run_dir)
        if previous and owner_pid(run_dir) is None:
            print(
                f"note: run {run_dir.name} was last launched by pid {previous.get('pid')} on "
                f"{previous.get('host')}, which is gone; taking it over (it resumes from its last checkpoint)",
                flush=True,
            )
        record_owner(run_dir)
        try:
            yield descriptor
        except SpecError:  # refused while preparing: a run this call created leaves nothing behind
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
            raise
    finally:
        os.close(descriptor)


def _recorded_owner(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None


def _held_by(run_dir: Path) -> str:
    owner = _recorded_owner(run_dir) or {}
    who = f"pid {owner['pid']} on {owner.get('host', '?')}" if "pid" in owner else "another launch (or its agents)"
    return (
        f"run {run_dir.name} is being trained by {who}: one writer per run. Wait for it, stop it with "
        f"`invoke stop --run-id {run_dir.name} --runs-dir {run_dir.parent}`, or pass another --run-id"
    )


def owner_pid(run_dir: Path) -> int | None:
    """The pid of the launcher running this run on this machine, or None (also when the recorded
    launcher died and its pid now belongs to another process)."""
    owner = _recorded_owner(run_dir)
    if owner is None:
        return None
    pid = owner.get("pid")
    if owner.get("host") != os.uname().nodename or not isinstance(pid, int):
        return None
    started = _started(pid)
    return pid if started is not None and started == owner.get("started") else None


def find_run(ref: RunRef) -> Path:
    runs = Path(ref.runs_dir)
    if ref.run_id:
        run_dir = runs / ref.run_id
        if not (run_dir / SPEC_FILE).is_file():
            known = sorted(p.parent.name for p in runs.glob(f"*/{SPEC_FILE}"))
            hint = f"runs there: {', '.join(known)}" if known else "no runs there"
            raise SpecError(f"--run-id {ref.run_id!r}: no run in {runs} ({hint}); check --run-id and --runs-dir")
        return run_dir
    specs = sorted(runs.glob(f"*/{SPEC_FILE}"), key=lambda p: p.stat().st_mtime)
    if not specs:
        raise SpecError(f"no runs in {runs}: start one with `invoke train` (or give --runs-dir)")
    return specs[-1].parent


def workload_label(run_dir: Path, kind: str) -> str:
    """What a run that is not a recipe ran, from the workload.json its launcher wrote (the script's name)."""
    try:
        label = json.loads((run_dir / WORKLOAD_FILE).read_text())["label"]
    except (OSError, ValueError, KeyError):
        return kind
    return kind if label == kind else f"{kind} {label}"


def launch_command(argv: list[str] | None = None) -> str:
    """The command this process was started with, as a user would type it again: `invoke train ...`, or
    `python -m trainkit ...` (a package run with -m has its __main__.py as argv[0]). Secrets it quotes are
    redacted (none should be there: tokens come from files)."""
    argv = sys.argv if argv is None else argv
    program = Path(argv[0])
    words = ["python", "-m", program.parent.name] if program.name == "__main__.py" else [program.name]
    return redact(shlex.join([*words, *argv[1:]]))


def record_launch(run_dir: Path, world_size: int) -> None:
    """This launch of the run, with its command, in events.jsonl. A run that continues on fewer processes forgets
    where the ranks it no longer has wrote (logs/ranks/<rank>.json; their logs stay): `invoke logs --rank` would
    show an earlier launch's as current."""
    append_event(run_dir, LAUNCH_EVENT, source="launcher", command=launch_command())
    for record in (run_dir / "logs" / RANK_LOGS_DIR).glob("*.json"):
        if record.stem.isdigit() and int(record.stem) >= world_size:
            record.unlink(missing_ok=True)


def record_finished(run_dir: Path) -> None:
    """A workload that writes no summary.json of its own (a script, the sweep) ended well: say so for `status`."""
    append_event(run_dir, FINISHED_EVENT, source="launcher")


def status(ref: RunRef) -> RunStatus:
    run_dir = find_run(ref)
    job = read_job(run_dir / SPEC_FILE)
    p, o = job.parallelism, job.optimisation
    pid = owner_pid(run_dir)
    events = read_events(run_dir)
    failure = recorded_failure(run_dir)
    if pid is not None:
        state = RunState.RUNNING
    elif (run_dir / "summary.json").exists() or (events and events[-1]["event"] == FINISHED_EVENT):
        state = RunState.FINISHED
    elif failure is not None:
        state = RunState.FAILED
    else:
        state = RunState.STOPPED if events and events[-1]["event"] == "stop" else RunState.LOST
    what = job.model.name if job.run.workload == "recipe" else workload_label(run_dir, job.run.workload)
    said = finished_said(state, stopped_early(run_summary(run_dir)))
    lines = [f"run {job.run.run_id} ({what}, {p.nodes} node(s) x {p.nproc} process(es)): {said}"]
    if state is RunState.FAILED:
        lines.append(f"  cause      {failure['line']}")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    if metrics:
        last = metrics[-1]
        total = f" of {o.steps}" if o.steps else ""
        ago = time.time() - (run_dir / "metrics.jsonl").stat().st_mtime
        loss = f", loss {last['loss']:.4f}" if isinstance(last.get("loss"), int | float) else ""
        lines.append(f"  step       {last['step']}{total}{loss}, {ago:.0f} s ago")
        evaluated = evaluation_line(job, metrics)
        if evaluated:
            lines.append(f"  eval       {evaluated}")
    lines.append(f"  restarts   {restarts_line(events)}")
    if tracked := mlflow_line(run_dir):
        lines.append(f"  mlflow     {tracked}")
    if pid is not None:
        lines.append(f"  launcher   pid {pid}; stop it with `invoke stop --run-id {job.run.run_id}`")
    if state is RunState.FAILED:
        lines.append(f"  again      {again_line(job.run.workload, failure, events)}")
    lines.append(f"  folder     {run_dir}")
    return RunStatus(state, "\n".join(lines))


def mlflow_line(run_dir: Path) -> str | None:
    """The run's MLflow run, as its rank 0 recorded it in the run folder (training/common/tracking.py), None: not
    tracked (or not yet reached)."""
    try:
        tracked = json.loads((run_dir / TRACKING_FILE).read_text())
    except (OSError, ValueError):
        return None
    embedded = str(tracked["uri"]).startswith("sqlite:")
    where = "the runs folder's store: `invoke obs.mlflow` shows it" if embedded else tracked["uri"]
    return f"run {tracked['run_id']}, experiment {tracked['experiment_id']}, {where}"


def evaluation_line(job, records: list[dict]) -> str | None:
    """The last evaluation and the best so far (the family's figure and which way is better), None before any."""
    if job.run.workload != "recipe" or not job.model.family:
        return None
    family = family_of(job.model.family)
    name = family.eval_metric
    evaluated = [r for r in records if r.get(name) is not None]
    if not evaluated:
        return None
    best = (min if family.lower_is_better else max)(evaluated, key=lambda r: r[name])
    last = evaluated[-1]
    return f"{name} {last[name]:.4f} at step {last['step']}, best {best[name]:.4f} at step {best['step']}"


def restarts_line(events: list[dict]) -> str:
    """What torchrun did (its attempts, each launch's first and its restarts) and how often the job resumed from a
    checkpoint (recipes and scripts that report steps note each start and resume)."""
    resumes = sum(1 for e in events if e.get("event") == "resume")
    resumed = f"the job resumed from a checkpoint {resumes} time{'s' * (resumes != 1)}"
    launches, tries = attempts(events)
    if not tries:  # a run of an earlier trainkit, whose agents noted no attempts
        return resumed
    restarts = tries - launches
    return (
        f"torchrun restarted the workers {restarts} time{'s' * (restarts != 1)} ({tries} attempt{'s' * (tries != 1)}"
        f" in {launches} launch{'es' * (launches != 1)}); {resumed}"
    )


def again_line(workload: str, failure: dict, events: list[dict]) -> str:
    """What to do about a failed run: mend the cause, then the command that launched it last (a recipe resumes from
    its last checkpoint; any other workload runs again, a script from its own checkpoints if it keeps them)."""
    if failure.get("type") == "Diverged":  # its settings are what diverged
        return "not resumed: change --lr, --warmup-steps or --grad-clip; train under a new --run-id"
    launches = [e for e in events if e.get("event") == LAUNCH_EVENT and e.get("command")]
    command = f": {launches[-1]['command']}" if launches else ""
    if failure.get("deadline"):  # stopped at --max-runtime, nothing to mend
        return (
            "the same command resumes from the last checkpoint with a fresh --max-runtime window (a larger "
            f"--max-runtime gives it more time){command}"
        )
    if workload == "recipe":
        return f"mend the cause; the same command resumes from the last checkpoint{command}"
    return f"mend the cause; the same command runs it again (a script from its own last checkpoint){command}"


def _rank_files(run_dir: Path, rank: int) -> list[Path]:
    record = run_dir / "logs" / RANK_LOGS_DIR / f"{rank}.json"
    if not record.exists():
        known = sorted(int(p.stem) for p in (run_dir / "logs" / RANK_LOGS_DIR).glob("*.json"))
        ranks = f"ranks with logs: {', '.join(map(str, known))}" if known else "no rank has started yet"
        raise SpecError(f"--rank {rank}: no log for that rank in {run_dir} ({ranks})")
    files = json.loads(record.read_text())
    return [Path(files[name]) for name in ("stdout", "stderr") if name in files]


def logs(ref: RunRef, rank: int | None = None, follow: bool = False) -> Iterator[str]:
    """Rank 0's output (the leader's), or another rank's: its stdout and stderr files, as torchrun wrote
    them; with `follow`, new lines as they come until the run's launcher has exited."""
    run_dir = find_run(ref)
    shown = 0 if rank is None else rank
    files = _rank_files(run_dir, shown)
    yield f"==> {run_dir.name} (rank {shown})" + (" (leader)" if rank is None else "")
    offsets = dict.fromkeys(files, 0)
    while True:
        for path in files:
            if not path.exists():
                continue
            with path.open("rb") as handle:
                handle.seek(offsets[path])
                data = handle.read()
            complete = data[: data.rfind(b"\n") + 1]
            offsets[path] += len(complete)
            yield from complete.decode(errors="replace").splitlines()
        if not follow or owner_pid(run_dir) is None:
            return
        time.sleep(FOLLOW_POLL_S)


def stop(ref: RunRef) -> str:
    """SIGTERM to the launcher, which stops its agents as Ctrl-C does: the workers checkpoint at the next
    step boundary when time allows, then exit."""
    run_dir = find_run(ref)
    pid = owner_pid(run_dir)
    if pid is None:
        raise SpecError(f"run {run_dir.name} is not running on this machine; nothing to stop")
    os.kill(pid, signal.SIGTERM)
    return (
        f"asked run {run_dir.name} to stop (launcher pid {pid}): it saves a checkpoint at the next step boundary "
        "when time allows; the same `invoke train` command resumes it"
    )
