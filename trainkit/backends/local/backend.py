"""Local backend: one torchrun agent per node on this machine, c10d or etcd rendezvous, a unique rendezvous id.

With `--nodes 1` this is a single torchrun; with `--nodes N` (or an elastic `MIN:MAX`) it starts N
agents that meet at one rendezvous, each a "node" with `--nproc` workers, so node loss, restarts and
scale-up can be exercised on one machine. Defaults that make recovery work (see docs/elastic.md):

- a unique rendezvous id per submission: a reused id can meet a closed rendezvous left by an
  earlier job (`RendezvousClosedError`);
- `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`: workers get their own store instead of sharing the
  rendezvous store, so a killed worker does not leave the next round hanging;
- a short `last_call_timeout` and heartbeat (trainkit/run/torchrun.py);
- its rendezvous kept from the machine's other users: c10d is `trainkit-c10d`, whose store listens on 127.0.0.1
  only, and both c10d's and etcd's state is signed with a key of the submission's, which another user cannot forge;
  that key and the rendezvous id travel in the agents' environment, never on their command lines
  (trainkit/run/rendezvous.py). The workers' own store and gloo's sockets are not closed yet (docs/security.md).

Every agent runs in its own session (process group). Ctrl-C or SIGTERM to the launcher is forwarded
as SIGTERM to every agent's group, which torchrun turns into an orderly stop of its workers;
whatever is still alive after a grace period is killed, so no process outlives the launcher.
`runs/<id>/launcher.pid` lists the agents' process-group ids, one line per node.

`--max-runtime` is the same stop, sent by the launcher itself when that many seconds have passed since it started
the agents (trainkit/backends/local/deadline.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from training.common.checkpoint import CHECKPOINTS_DIR, remove_partial
from training.common.failure import EXIT_NO_RETRY, NODE_ENV
from training.spec import METRICS_PORT_OFFSET_ENV, PROGRESS_ENV, Job
from trainkit import hardware
from trainkit.backends.base import Backend, RunRef
from trainkit.backends.local import runs as local_runs
from trainkit.backends.local.console import RankZeroConsole, other_ranks_errors, summary_block
from trainkit.backends.local.deadline import EXIT_DEADLINE, record_deadline
from trainkit.backends.local.task import run_task
from trainkit.errors import JobFailed
from trainkit.job.build import Machine, local_machine
from trainkit.run.failures import FailureChannel, failure_summary, forget_failure, record_failure, wait_for_records
from trainkit.run.state import RunStatus
from trainkit.run.storage import measure_write_mb_s, needs_measuring
from trainkit.run.torchrun import (
    LOCAL_RDZV_BACKENDS,
    Placement,
    PreparedRun,
    private_rendezvous,
    rendezvous_id,
    torchrun_command,
)
from trainkit.run.tracked import FAILED, FINISHED, KILLED, end_tracked
from trainkit.run.workload import Workload, ready
from trainkit.services import LocalEtcd, LocalPrometheus

# Seconds the launcher waits after forwarding a stop before it kills what is left: torchrun gives
# its workers 30 s to finish (they save a checkpoint when time allows), plus a margin.
GRACE_SECONDS = 40
# Seconds the other nodes' agents get to notice a failure no restart mends before they are asked to stop: the
# failing node's agent stops by itself; the others would only restart and wait for it (trainkit/run/agent.py).
NO_RETRY_STOP_S = 5
PID_FILE = "launcher.pid"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_command(run: PreparedRun, endpoint: str, node: int, tee: bool = False) -> list[str]:
    """torchrun for one node on this machine; with c10d, node 0 hosts the store (decided, not left to a
    bind race between agents on one host), so the store's single point of failure is a known node.
    Ranks write to their files only unless `tee` (console.py shows rank 0's on the console). The rendezvous id
    is not on it: the agents' environment has it (private_rendezvous)."""
    job = run.job
    log_dir = job.run_dir / "logs" / (f"node-{node}" if job.parallelism.nodes > 1 else "")
    backend = LOCAL_RDZV_BACKENDS[job.elastic.rdzv]
    return torchrun_command(run, endpoint, None, log_dir, Placement(is_host=node == 0), tee=tee, rdzv_backend=backend)


def node_environment(env: dict[str, str], job: Job, node: int) -> dict[str, str]:
    """Nodes share this machine, so each gets its own block of metrics ports (rank r serves port + r
    across the whole job, as on one node). TRAINKIT_NODE names the node in its agent's reports."""
    return {**env, METRICS_PORT_OFFSET_ENV: str(node * job.parallelism.nproc), NODE_ENV: f"node-{node}"}


def metrics_addresses(job: Job) -> list[str]:
    """Every rank's metrics address on this machine (node n's ranks follow node n-1's, see node_environment)."""
    if not job.run.metrics_port:
        return []
    return [f"127.0.0.1:{job.run.metrics_port + rank}" for rank in range(job.world_size)]


def job_environment(run: PreparedRun) -> dict[str, str]:
    env = dict(os.environ)
    env.update(run.env)
    if hardware.local_gpu_count() == 0 and "OMP_NUM_THREADS" not in env:
        # torchrun defaults every worker to 1 thread; share the cores out instead.
        env["OMP_NUM_THREADS"] = str(max(1, hardware.local_cpu_count() // run.job.world_size))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


def job_exit_code(codes: list[int | None]) -> int:
    """The job's outcome from its agents' exit codes. An agent exits 0 only when its workers finished
    training, so one such agent means the job finished, even if other nodes were lost or stopped on
    the way (elastic: the survivors carried on). Otherwise the first failure is the job's code; an
    agent killed by a signal counts as 128 + signal."""
    if any(code == 0 for code in codes):
        return 0
    failed = [code for code in codes if code is not None and code > 0]
    if failed:
        return failed[0]
    killed = [code for code in codes if code is not None and code < 0]
    return 128 - min(killed) if killed else 1


def explain_failure(job: Job, codes: list[int | None]) -> str | None:
    """One clear sentence for the failure elastic training cannot recover from on its own."""
    if job.elastic.rdzv == "c10d" and job.parallelism.nodes > 1 and codes and codes[0] is not None and codes[0] < 0:
        return (
            "node 0 was lost and it hosted the c10d rendezvous store, so the other nodes cannot meet again "
            "(c10d's single point of failure). Run the same command with the same --run-id to continue from "
            "the last checkpoint; --rdzv etcd keeps the store outside the nodes."
        )
    return None


class LocalJob:
    """The agents of one submission: start them (or one node again), signal them, wait for them."""

    def __init__(self, run: PreparedRun, output=None, keep_open: tuple[int, ...] = ()):
        self.run = run
        self.keep_open = keep_open
        job = run.job
        self.endpoint = job.elastic.rdzv_endpoint or f"127.0.0.1:{free_port()}"
        self.rdzv_id = rendezvous_id(job)
        # What failing ranks and agents report (training/common/failure.py), off the runs volume.
        self.failures = FailureChannel()
        self.env = {**job_environment(run), **self.failures.env, **private_rendezvous(self.rdzv_id)}
        # None: the agents write to this process's stdout/stderr, and rank 0's output is followed onto it
        # (RankZeroConsole); a file: the agents and, prefixed, every rank write there.
        self.output = output
        self.agents: dict[int, subprocess.Popen] = {}
        self.pid_file = job.run_dir / PID_FILE
        self.scrape_file: Path | None = None
        self.deadline_at: float | None = None
        """When (wall clock) `wait` stopped the job at its `stop_at` deadline; None while it has not."""

    def start(self) -> None:
        job = self.run.job
        (job.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        for node in range(job.parallelism.nodes):
            self.start_node(node)
        self.scrape_file = LocalPrometheus().watch_job(job.run.run_id, metrics_addresses(job))

    def start_node(self, node: int) -> subprocess.Popen:
        """Start (or start again, after a loss) the agent of one node."""
        agent = subprocess.Popen(
            node_command(self.run, self.endpoint, node, tee=self.output is not None),
            env=node_environment(self.env, self.run.job, node),
            start_new_session=True,
            stdout=self.output,
            stderr=subprocess.STDOUT if self.output else None,
            pass_fds=self.keep_open,
        )
        self.agents[node] = agent
        self.pid_file.write_text("".join(f"{a.pid}\n" for a in self.agents.values()))
        return agent

    def codes(self) -> list[int | None]:
        return [agent.poll() for _, agent in sorted(self.agents.items())]

    def signal_all(self, sig: int) -> None:
        for agent in self.agents.values():
            signal_group(agent.pid, sig)

    def kill_all(self) -> None:
        """Nothing of the job outlives this: every agent's group, then wait for them."""
        self.signal_all(signal.SIGKILL)
        for agent in self.agents.values():
            agent.wait()
        self.pid_file.unlink(missing_ok=True)
        if self.scrape_file:
            self.scrape_file.unlink(missing_ok=True)
        self.failures.close()

    def wait(
        self, stopping: list[int] | None = None, deadline: float | None = None, stop_at: float | None = None
    ) -> list[int | None] | None:
        """Every agent's exit code, or None when `deadline` (monotonic) passes or the job outlives the
        grace period after a stop was requested (`stopping` becomes non-empty). A failure no restart mends
        stops the agents still running NO_RETRY_STOP_S after it was reported. At `stop_at` (monotonic: the
        --max-runtime deadline) the agents are stopped as a user's stop does it, with the same grace, unless a
        stop is already under way; `deadline_at` then says when."""
        grace_ends = no_retry_at = None
        while True:
            codes = self.codes()
            if all(code is not None for code in codes):
                if any(codes):  # a failure: reports sent just before the exits may still be arriving
                    wait_for_records(self.failures)
                return codes
            self.failures.poll()
            now = time.monotonic()
            if no_retry_at is None and self.failures.permanent():
                no_retry_at = now + NO_RETRY_STOP_S
            if no_retry_at is not None and now > no_retry_at:
                self.signal_all(signal.SIGTERM)
                no_retry_at = float("inf")  # once
                grace_ends = now + GRACE_SECONDS
            if stopping and grace_ends is None:
                grace_ends = now + GRACE_SECONDS
            if stop_at is not None and now > stop_at and grace_ends is None:
                self.deadline_at = time.time()  # before the signal: the ranks' stop events come after it
                self.signal_all(signal.SIGTERM)
                grace_ends = now + GRACE_SECONDS
            if (grace_ends is not None and now > grace_ends) or (deadline is not None and now > deadline):
                return None
            time.sleep(0.2)

    def failure(self, codes: list[int | None]) -> tuple[int, dict]:
        """The failed job's exit code and the record of its cause (also kept for `invoke status`)."""
        job = self.run.job
        code = job_exit_code(codes)
        cause = self.failures.cause()
        if cause is not None and cause.get("permanent"):
            code = EXIT_NO_RETRY
        reason = explain_failure(job, codes)
        if reason is not None:  # the launcher knows more than any rank: the store's node is gone
            cause = {"source": "launcher", "time": time.time(), "cause": reason}
        if cause is None:
            cause = {
                "source": "launcher",
                "time": time.time(),
                "cause": f"the agents exited with codes {codes} and no rank reported an error",
                "log": str(job.run_dir / "logs"),
                "unreported": True,
            }
        record_failure(job.run_dir, cause, code)
        return code, cause


def run_foreground(run: PreparedRun, keep_open: tuple[int, ...] = ()) -> int:
    """Run a prepared job to its end here; Ctrl-C (or SIGTERM) stops it at a step boundary, a second one
    kills it; so does --max-runtime, once that many seconds have passed since the agents started. Returns 0 when it
    finished; a failed or stopped run raises JobFailed with its exit code (EXIT_DEADLINE at the deadline) and, in
    one line, why (a failure's or deadline's cause is also kept for `invoke status`). `keep_open`: descriptors the
    agents inherit (the run lock)."""
    if sys.stdout.isatty() and sys.stderr.isatty() and PROGRESS_ENV not in os.environ:
        run.env[PROGRESS_ENV] = "bar"  # rank 0's output reaches a terminal (RankZeroConsole)
    started = time.monotonic()
    job = LocalJob(run, keep_open=keep_open)
    owner = local_runs.record_owner(run.job.run_dir)
    console = RankZeroConsole(run.job.run_dir)
    received: list[int] = []

    def forward(signum, _frame):
        received.append(signum)
        # First signal: orderly stop through torchrun. A second one: kill at once.
        job.signal_all(signal.SIGTERM if len(received) == 1 else signal.SIGKILL)

    # Before the agents start: a Ctrl-C at any moment stops them (they run in sessions of their own).
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    forget_failure(run.job.run_dir)
    local_runs.record_launch(run.job.run_dir, run.job.world_size)
    failed = expired = None
    limit = run.job.placement.max_runtime
    try:
        job.start()
        console.start()
        codes = job.wait(received, stop_at=None if limit is None else time.monotonic() + limit)
        ended = codes if codes is not None else job.codes()  # None: agents that outlived their stop
        if job.deadline_at is not None and not job.failures.permanent() and job_exit_code(ended):
            # The deadline's stop came first (a user's stop after it only hurries it); a run that finished
            # during the grace period finished.
            expired = record_deadline(run.job, job.deadline_at)
        elif not received and (codes is None or job_exit_code(codes)):
            failed = job.failure(ended)
    finally:
        job.kill_all()
        if console.is_alive():
            console.stop()
        owner.unlink(missing_ok=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed is not None or expired is not None or received:
        # Every rank is gone, so nothing still writes into a save that never published: its space (a full
        # volume's) comes back now, not at the next start.
        remove_partial(run.job.run_dir / CHECKPOINTS_DIR)
    run_id = run.job.run.run_id
    if expired is not None:
        end_tracked(run.job, KILLED, expired)
        raise JobFailed(EXIT_DEADLINE, expired)
    if received:
        name = signal.Signals(received[0]).name
        end_tracked(run.job, KILLED, f"stopped ({name}); the same command resumes it")
        raise JobFailed(128 + received[0], f"run {run_id} stopped ({name}); the same command resumes it")
    if failed is not None:
        code, cause = failed
        if cause.get("unreported"):  # no rank said why: their last tracebacks, if any
            others = other_ranks_errors(run.job.run_dir, console.since)
            if others:
                print(others, file=sys.stderr, flush=True)
        end_tracked(run.job, FAILED, failure_summary(cause))
        raise JobFailed(code, f"run {run_id} failed: {failure_summary(cause)}")
    end_tracked(run.job, FINISHED)
    summary = summary_block(run.job, time.monotonic() - started)
    if summary:
        print(summary, flush=True)
    return 0


def announce(job: Job, workload: Workload) -> None:
    """The launcher's adjustments and the run in one line, once its folder is ready."""
    for note in job.run.notes:
        print(f"note: {note}", flush=True)
    p, o = job.parallelism, job.optimisation
    shape = f"{p.nodes} node(s) x {p.nproc} process(es)"
    kind = job.run.workload
    if kind != "recipe":
        what = kind if workload.label == kind else f"{kind} {workload.label}"
        print(f"run {job.run.run_id}: {what}, {shape} -> {job.run_dir}", flush=True)
        return
    label = f" [{job.model.truncated_label}]" if job.model.truncated_label else ""
    length = f"{o.steps} steps" if o.steps else f"{o.epochs} epoch(s)"
    print(
        f"run {job.run.run_id}{label}: {job.model.name}, {shape}, {p.sharding}, {length} -> {job.run_dir}", flush=True
    )


class LocalBackend(Backend):
    """torchrun agents on this machine; a run is followed and stopped through its run folder."""

    name = "local"

    def resolve(self, job: Job) -> Machine:
        here = local_machine()
        p, elastic = job.parallelism, job.elastic
        if p.nproc is None:
            p.nproc = here.process_limit if here.gpus_per_node else min(2, here.process_limit)
        if elastic.rdzv is None:
            elastic.rdzv = "c10d"
        if elastic.rdzv == "etcd" and not elastic.rdzv_endpoint:
            elastic.rdzv_endpoint = LocalEtcd().endpoint()  # the one `make up` started, if it runs
        return here

    def storage_mb_s(self, job: Job) -> float | None:
        """Measured on the run folder's disk, where a checkpoint is large enough for a slow disk to matter."""
        if not needs_measuring(job):
            return None
        try:
            return round(measure_write_mb_s(job.run_dir), 1)
        except OSError as error:  # the run folder's disk refuses writes: the run will say so itself, more plainly
            job.run.notes.append(f"could not measure the write throughput of {job.run_dir}'s disk ({error})")
            return None

    def submit(self, job: Job, workload: Workload, dry_run: bool = False) -> int:
        if dry_run:
            print(json.dumps(job.to_dict(), indent=2, sort_keys=True), flush=True)
            if job.run.workload != "recipe":
                print(json.dumps({"workload": json.loads(workload.to_json())}, indent=2, sort_keys=True), flush=True)
            return 0
        if not workload.distributed:
            return run_task(job, workload)
        with local_runs.run_lock(job.run_dir) as lock:  # before the preparation rewrites anything of the run
            run = ready(job, workload)
            announce(job, workload)
            run_foreground(run, keep_open=(lock,))  # a failed run raises JobFailed
            if job.run.workload != "recipe":
                local_runs.record_finished(job.run_dir)
        if workload.outputs:
            print(f"results: {', '.join(str(job.run_dir / name) for name in workload.outputs)}", flush=True)
        return 0

    def status(self, ref: RunRef) -> RunStatus:
        return local_runs.status(ref)

    def logs(self, ref: RunRef, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        return local_runs.logs(ref, rank, follow)

    def stop(self, ref: RunRef) -> str:
        return local_runs.stop(ref)


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
