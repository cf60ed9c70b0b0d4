"""Local backend: one torchrun agent per node on this machine, c10d or etcd rendezvous, a unique rendezvous id.

With `--nodes 1` this is a single torchrun; with `--nodes N` (or an elastic `MIN:MAX`) it starts N
agents that meet at one rendezvous, each a "node" with `--nproc` workers, so node loss, restarts and
scale-up can be exercised on one machine. Defaults that make recovery work (see the README, "Elastic
training"):

- a unique rendezvous id per submission: a reused id can meet a closed rendezvous left by an
  earlier job (`RendezvousClosedError`);
- `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`: workers get their own store instead of sharing the
  rendezvous store, so a killed worker does not leave the next round hanging;
- a short `last_call_timeout` and heartbeat (trainkit/torchrun.py).

Every agent runs in its own session (process group). Ctrl-C or SIGTERM to the launcher is forwarded
as SIGTERM to every agent's group, which torchrun turns into an orderly stop of its workers;
whatever is still alive after a grace period is killed, so no process outlives the launcher.
`runs/<id>/launcher.pid` lists the agents' process-group ids, one line per node.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .. import hardware
from ..launch import PreparedRun
from ..services import LocalPrometheus
from ..spec import JobSpec
from ..torchrun import rendezvous_id, torchrun_command

# Seconds the launcher waits after forwarding a stop before it kills what is left: torchrun gives
# its workers 30 s to finish (they save a checkpoint when time allows), plus a margin.
GRACE_SECONDS = 40


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_command(run: PreparedRun, endpoint: str, rdzv_id: str, node: int) -> list[str]:
    """torchrun for one node on this machine; with c10d, node 0 hosts the store (decided, not left to a
    bind race between agents on one host), so the store's single point of failure is a known node."""
    spec = run.spec
    log_dir = spec.run_dir / "logs" / (f"node-{node}" if spec.nodes > 1 else "")
    return torchrun_command(run, endpoint, rdzv_id, log_dir, node_args(run, node), is_host=node == 0)


def node_args(run: PreparedRun, node: int) -> list[str]:
    """The entry point's arguments for one node. Nodes share this machine, so each gets its own block
    of metrics ports (rank r serves port + r across the whole job, as on one node)."""
    args = list(run.args)
    if node and "--metrics-port" in args:
        at = args.index("--metrics-port") + 1
        if int(args[at]):
            args[at] = str(int(args[at]) + node * run.spec.nproc)
    return args


def metrics_addresses(spec: JobSpec) -> list[str]:
    """Every rank's metrics address on this machine (node n's ranks follow node n-1's, see node_args)."""
    if not spec.metrics_port:
        return []
    return [f"127.0.0.1:{spec.metrics_port + rank}" for rank in range(spec.nodes * spec.nproc)]


def job_environment(run: PreparedRun) -> dict[str, str]:
    env = dict(os.environ)
    env.update(run.env)
    if hardware.local_gpu_count() == 0 and "OMP_NUM_THREADS" not in env:
        # torchrun defaults every worker to 1 thread; share the cores out instead.
        env["OMP_NUM_THREADS"] = str(max(1, hardware.local_cpu_count() // (run.spec.nproc * run.spec.nodes)))
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


def explain_failure(spec: JobSpec, codes: list[int | None]) -> str | None:
    """One clear sentence for the failure elastic training cannot recover from on its own."""
    if spec.rdzv == "c10d" and spec.nodes > 1 and codes and codes[0] is not None and codes[0] < 0:
        return (
            "node 0 was lost and it hosted the c10d rendezvous store, so the other nodes cannot meet again "
            "(c10d's single point of failure). Run the same command with the same --run-id to continue from "
            "the last checkpoint; --rdzv etcd keeps the store outside the nodes."
        )
    return None


class LocalJob:
    """The agents of one submission: start them (or one node again), signal them, wait for them."""

    def __init__(self, run: PreparedRun, output=None):
        self.run = run
        spec = run.spec
        self.endpoint = spec.rdzv_endpoint or f"127.0.0.1:{free_port()}"
        self.rdzv_id = rendezvous_id(spec)
        self.env = job_environment(run)
        self.output = output  # None: the agents write to this process's stdout/stderr
        self.agents: dict[int, subprocess.Popen] = {}
        self.pid_file = spec.run_dir / "launcher.pid"
        self.scrape_file: Path | None = None

    def start(self) -> None:
        spec = self.run.spec
        (spec.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        for node in range(spec.nodes):
            self.start_node(node)
        self.scrape_file = LocalPrometheus().watch_job(spec.run_id, metrics_addresses(spec))

    def start_node(self, node: int) -> subprocess.Popen:
        """Start (or start again, after a loss) the agent of one node."""
        agent = subprocess.Popen(
            node_command(self.run, self.endpoint, self.rdzv_id, node),
            env=self.env,
            start_new_session=True,
            stdout=self.output,
            stderr=subprocess.STDOUT if self.output else None,
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

    def wait(self, stopping: list[int] | None = None, deadline: float | None = None) -> list[int | None] | None:
        """Every agent's exit code, or None when `deadline` (monotonic) passes or the job outlives the
        grace period after a stop was requested (`stopping` becomes non-empty)."""
        grace_ends = None
        while True:
            codes = self.codes()
            if all(code is not None for code in codes):
                return codes
            if stopping and grace_ends is None:
                grace_ends = time.monotonic() + GRACE_SECONDS
            now = time.monotonic()
            if (grace_ends is not None and now > grace_ends) or (deadline is not None and now > deadline):
                return None
            time.sleep(0.2)


class LocalBackend:
    def submit(self, run: PreparedRun) -> int:
        job = LocalJob(run)
        job.start()
        received: list[int] = []

        def forward(signum, _frame):
            received.append(signum)
            # First signal: orderly stop through torchrun. A second one: kill at once.
            job.signal_all(signal.SIGTERM if len(received) == 1 else signal.SIGKILL)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            codes = job.wait(received)
        finally:
            job.kill_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if received:
            return 128 + received[0]
        if codes is None:
            return 1
        code = job_exit_code(codes)
        reason = explain_failure(run.spec, codes) if code else None
        if reason:
            print(f"error: {reason}", file=sys.stderr, flush=True)
        return code


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
