"""Runs scenarios: a real elastic job per scenario, the fault injected mid-run, the outcome measured."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from training.common.files import read_events, read_jsonl
from trainkit.backends import job_from_flags
from trainkit.backends.local.backend import LocalJob, explain_failure, job_exit_code, signal_group
from trainkit.bench.chaos.scenarios import SCENARIOS, Result, Settings
from trainkit.bench.chaos.table import describe
from trainkit.errors import SpecError
from trainkit.run.failures import failure_summary
from trainkit.run.workload import ready
from trainkit.services import EtcdServer
from trainkit.workloads.recipe import recipe


def _children(pid: int) -> list[int]:
    """Direct children of a process (torchrun's workers are children of their agent)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class Limit:
    """When a scenario has run too long: `stall_s` seconds without progress, or `timeout_s` in all."""

    def __init__(self, stall_s: float, timeout_s: float, clock: Callable[[], float] = time.monotonic):
        self.stall_s, self.timeout_s, self.clock = stall_s, timeout_s, clock
        self.started = self.progressed = clock()

    def progress(self) -> None:
        self.progressed = self.clock()

    def passed(self) -> str | None:
        """Why the limit has passed, or None while it has not."""
        now = self.clock()
        if now - self.started > self.timeout_s:
            return f"no end within {self.timeout_s:.0f} s"
        if now - self.progressed > self.stall_s:
            return f"no progress (step or event) for {self.stall_s:.0f} s"
        return None


class _Run:
    """One scenario's job, the handles its fault needs, and every step record seen while it ran
    (a resume truncates metrics.jsonl back to its checkpoint, so the redone steps are kept here).
    Each new step record or event counts as progress on `limit`."""

    def __init__(self, job: LocalJob, etcd: EtcdServer | None, limit: Limit):
        self.job, self.etcd, self.limit = job, etcd, limit
        self.run_dir = job.run.job.run_dir
        self.last = job.run.job.parallelism.nodes - 1
        self.seen: dict[float, dict] = {}
        self.events_seen = 0

    def steps(self) -> list[dict]:
        records = read_jsonl(self.run_dir / "metrics.jsonl")
        for record in records:
            if record["time"] not in self.seen:
                self.limit.progress()
            self.seen[record["time"]] = record
        return records

    def events(self) -> list[dict]:
        events = read_events(self.run_dir)
        if len(events) > self.events_seen:
            self.events_seen = len(events)
            self.limit.progress()
        return events

    def ended(self) -> bool:
        return all(code is not None for code in self.job.codes())

    def kill_node(self, node: int) -> None:
        agent = self.job.agents[node]
        workers = _children(agent.pid)
        signal_group(agent.pid, signal.SIGKILL)
        for pid in workers:
            _kill(pid, signal.SIGKILL)

    def wait_for(self, what: Callable[[list[dict]], bool]) -> bool:
        """Poll until `what(step records)` holds, the job ends or the limit passes."""
        while True:
            ended = self.ended()
            self.events()
            if what(self.steps()):
                return True
            if ended or self.limit.passed():
                return False
            time.sleep(0.05)

    def follow(self) -> list[int | None] | None:
        """Record every step until the job ends: its agents' exit codes, or None once the limit passed."""
        self.wait_for(lambda _steps: False)
        return self.job.codes() if self.ended() else None


def _inject(name: str, backend: str, run: _Run, fault_time: float) -> None:
    agent = run.job.agents[run.last]
    if name == "worker-kill":
        workers = _children(agent.pid)
        if workers:
            _kill(workers[0], signal.SIGKILL)
    elif name in ("node-kill", "node-return"):
        run.kill_node(run.last)
    elif name == "agent-kill":
        _kill(agent.pid, signal.SIGKILL)
    elif name == "agent-term":
        _kill(agent.pid, signal.SIGTERM)
    elif name == "node0-kill":
        run.kill_node(0)
    elif name == "store-loss":
        if backend == "etcd":
            run.etcd.restart(down_seconds=1.0)
        else:
            _kill(run.job.agents[0].pid, signal.SIGKILL)
    if name == "node-return":
        # Back once the survivors train again on their own, as a replaced node would be.
        def training_again(steps: list[dict]) -> bool:
            resumed = [e["time"] for e in run.events() if e["event"] == "resume" and e["time"] > fault_time]
            return bool(resumed) and any(r["time"] > resumed[0] for r in steps)

        if run.wait_for(training_again):
            run.job.start_node(run.last)


@contextlib.contextmanager
def _job(overrides: dict) -> Iterator[LocalJob]:
    """A started job whose agents log to runs/<id>/agents.log; nothing of it outlives the block."""
    spec = job_from_flags(overrides)
    prepared = ready(spec, recipe(spec))
    with (prepared.job.run_dir / "agents.log").open("w") as log:
        job = LocalJob(prepared, output=log)
        job.start()
        try:
            yield job
        finally:
            job.kill_all()


def run_scenario(
    name: str,
    backend: str,
    workdir: Path,
    settings: Settings | None = None,
    baseline_loss: float | None = None,
) -> Result:
    """Run one scenario to its end (or its timeout) and measure it."""
    settings = settings or Settings()
    scenario = SCENARIOS[name]
    expected = scenario.expected.get(backend, "finished")
    workdir = Path(workdir)
    started = time.monotonic()
    etcd = EtcdServer(workdir / f"etcd-{name}").start() if backend == "etcd" else None
    try:
        overrides = settings.overrides(backend, f"{name}-{backend}", workdir / "runs", etcd and etcd.endpoint)
        with _job(overrides) as job:
            run = _Run(job, etcd, Limit(settings.stall_s, settings.timeout_s))
            return _observe(scenario, backend, expected, run, settings, started, baseline_loss)
    finally:
        if etcd:
            etcd.stop()


def _observe(scenario, backend, expected, run: _Run, settings, started, baseline_loss) -> Result:
    result = Result(scenario.name, backend, expected, outcome="timeout", seconds=0.0)
    reached = run.wait_for(lambda steps: any(r["step"] >= settings.fault_step for r in steps))
    fault_time = time.time()
    if not reached:
        result.problems.append(f"the job never reached step {settings.fault_step}")
    else:
        _inject(scenario.name, backend, run, fault_time)
    codes = run.follow()
    result.seconds = round(time.monotonic() - started, 1)
    if codes is None:
        result.problems.append(run.limit.passed() or "no end")
        return result
    code = job_exit_code(codes)
    summary_path = run.run_dir / "summary.json"
    if code:
        result.outcome = "error"
        result.seconds_to_error = round(time.time() - fault_time, 1)
        reason = explain_failure(run.job.run.job, codes)
        cause = run.job.failures.cause()  # what a rank or agent reported (trainkit/run/failures.py)
        told = failure_summary(cause) if cause else None
        result.error = reason or told or f"exit code {code}; see {run.run_dir}/agents.log"
        if expected == "error" and reason is None:
            result.problems.append("failed without saying why")
        return result
    result.outcome = "finished" if summary_path.exists() else "error"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    _measure(result, fault_time, list(run.seen.values()), run.events(), summary)
    if baseline_loss is not None and result.final_loss is not None:
        result.loss_delta = round(result.final_loss - baseline_loss, 6)
    if result.final_step != settings.steps:
        result.problems.append(f"finished at step {result.final_step}, expected {settings.steps}")
    if result.steps_lost is not None and result.steps_lost > settings.checkpoint_interval:
        result.problems.append(f"lost {result.steps_lost} steps, more than the checkpoint interval")
    return result


def _measure(result: Result, fault_time: float, seen: list[dict], events: list[dict], summary: dict) -> None:
    """Per resume after the fault: steps redone (last step before it - the step it resumed from) and
    the gap from the last step before it to the first step after it. Without a resume (the fault
    did not interrupt training) the gap is the one across the fault."""
    seen = sorted(seen, key=lambda r: r["time"])
    resumes = [e for e in events if e["event"] == "resume" and e["time"] > fault_time]
    gaps, lost = [], 0
    for resume in resumes or [{"time": fault_time, "step": None}]:
        prior = [r for r in seen if r["time"] < resume["time"]]
        later = [r for r in seen if r["time"] > resume["time"]]
        if prior and later:
            gaps.append(round(later[0]["time"] - prior[-1]["time"], 1))
        if prior and resume["step"] is not None:
            lost += max(0, max(r["step"] for r in prior) - resume["step"])
    result.restarts = len(resumes)
    result.recovery_s = gaps[0] if gaps else None
    result.steps_lost = lost
    result.final_step = summary.get("steps")
    result.final_world_size = summary.get("world_size")
    result.final_loss = summary.get("last_loss")


def run_baseline(workdir: Path, settings: Settings | None = None) -> float:
    """The same job with no fault: its final loss is what every recovered run is compared with."""
    settings = settings or Settings()
    with _job(settings.overrides("c10d", "baseline", Path(workdir) / "runs", None)) as job:
        codes = job.wait(deadline=time.monotonic() + settings.timeout_s)
    run_dir = job.run.job.run_dir
    if codes is None or job_exit_code(codes):
        raise RuntimeError(f"the uninterrupted run failed; see {run_dir}/agents.log")
    return json.loads((run_dir / "summary.json").read_text())["last_loss"]


def run_matrix(
    pairs: list[tuple[str, str]],
    workdir: Path,
    settings: Settings | None = None,
    parallel: int = 1,
    report: Callable[[str], None] = print,
) -> dict:
    """The uninterrupted run, then every pair (`parallel` at a time; 1 gives undisturbed timings).
    Returns the benchmark record written to benchmarks/elastic.json."""
    import torch

    if parallel < 1:
        raise SpecError(f"--parallel must be a positive integer (got {parallel})")
    settings = settings or Settings()
    workdir = Path(workdir)
    baseline = run_baseline(workdir / "baseline", settings)
    report(f"uninterrupted run: final loss {baseline:.4f}")

    def one(pair: tuple[str, str]) -> Result:
        result = run_scenario(*pair, workdir / "-".join(pair), settings, baseline)
        report(describe(result))
        return result

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        results = list(pool.map(one, pairs))
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "measured": time.strftime("%Y-%m-%d"),
        "parallel": parallel,
        "settings": asdict(settings),
        "baseline_final_loss": baseline,
        "results": [dict(asdict(r), ok=r.ok) for r in results],
    }
