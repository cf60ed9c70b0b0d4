"""Local backend: one torchrun agent per node on this machine, c10d or etcd rendezvous, a unique rendezvous id.

With `--nodes 1` this is a single torchrun; with `--nodes N` (or an elastic `MIN:MAX`) it starts N
agents that meet at one rendezvous, each a "node" with `--nproc` workers, so node loss, restarts and
scale-up can be exercised on one machine. Defaults that make recovery work (see the README, "Elastic
training"):

- a unique rendezvous id per submission: a reused id can meet a closed rendezvous left by an
  earlier job (`RendezvousClosedError`);
- `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`: workers get their own store instead of sharing the
  rendezvous store, so a killed worker does not leave the next round hanging;
- a short `last_call_timeout`, so a shrunken job restarts quickly once the survivors have joined.

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
import uuid

from .. import hardware
from ..launch import PreparedRun
from ..spec import JobSpec

GRACE_SECONDS = 20
# Seconds the rendezvous waits for more nodes once the minimum has joined (torch's default: 30).
LAST_CALL_TIMEOUT_S = 5
RDZV_BACKENDS = {"c10d": "c10d", "etcd": "etcd-v2"}  # etcd: the dynamic rendezvous on etcd's v2 API


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rendezvous_id(spec: JobSpec) -> str:
    """Unique per submission: a reused id can meet a closed rendezvous left by an earlier job."""
    return f"{spec.run_id}-{uuid.uuid4().hex[:8]}"


def torchrun_command(run: PreparedRun, endpoint: str, rdzv_id: str, node: int = 0) -> list[str]:
    spec = run.spec
    nnodes = str(spec.nodes) if spec.min_nodes == spec.nodes else f"{spec.min_nodes}:{spec.nodes}"
    log_dir = spec.run_dir / "logs" / (f"node-{node}" if spec.nodes > 1 else "")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        str(spec.nproc),
        "--rdzv-backend",
        RDZV_BACKENDS[spec.rdzv],
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        rdzv_id,
        "--rdzv-conf",
        f"last_call_timeout={LAST_CALL_TIMEOUT_S}",
        "--max-restarts",
        str(spec.max_restarts),
        "--log-dir",
        str(log_dir),
        "--tee",
        "3",
        "-m",
        run.module,
        *node_args(run, node),
    ]


def node_args(run: PreparedRun, node: int) -> list[str]:
    """The entry point's arguments for one node. Nodes share this machine, so each gets its own block
    of metrics ports (rank r serves port + r across the whole job, as on one node)."""
    args = list(run.args)
    if node and "--metrics-port" in args:
        at = args.index("--metrics-port") + 1
        if int(args[at]):
            args[at] = str(int(args[at]) + node * run.spec.nproc)
    return args


def job_environment(run: PreparedRun) -> dict[str, str]:
    env = dict(os.environ)
    env.update(run.env)
    if hardware.local_gpu_count() == 0 and "OMP_NUM_THREADS" not in env:
        # torchrun defaults every worker to 1 thread; share the cores out instead.
        env["OMP_NUM_THREADS"] = str(max(1, hardware.local_cpu_count() // (run.spec.nproc * run.spec.nodes)))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


def job_exit_code(codes: list[int]) -> int:
    """The job's outcome from its agents' exit codes: a node that was killed (negative code) is a lost
    node, not a failure, as long as the others finished; any agent that failed on its own fails the job."""
    failed = [code for code in codes if code > 0]
    if failed:
        return failed[0]
    return 0 if any(code == 0 for code in codes) else 128 - min(codes)


class LocalBackend:
    def submit(self, run: PreparedRun) -> int:
        spec = run.spec
        endpoint = spec.rdzv_endpoint or f"127.0.0.1:{free_port()}"
        rdzv_id = rendezvous_id(spec)
        (spec.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        env = job_environment(run)
        agents = [
            subprocess.Popen(torchrun_command(run, endpoint, rdzv_id, node), env=env, start_new_session=True)
            for node in range(spec.nodes)
        ]
        pid_file = spec.run_dir / "launcher.pid"
        pid_file.write_text("".join(f"{agent.pid}\n" for agent in agents))
        received: list[int] = []

        def forward(signum, _frame):
            received.append(signum)
            # First signal: orderly stop through torchrun. A second one: kill at once.
            for agent in agents:
                _signal_group(agent.pid, signal.SIGTERM if len(received) == 1 else signal.SIGKILL)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            codes = _wait(agents, received)
        finally:
            for agent in agents:  # nothing of the job outlives the launcher
                _signal_group(agent.pid, signal.SIGKILL)
                agent.wait()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            pid_file.unlink(missing_ok=True)
        if received:
            return 128 + received[0]
        return job_exit_code(codes) if codes is not None else 1


def _wait(agents: list[subprocess.Popen], received: list[int]) -> list[int] | None:
    """Every agent's exit code, or None when the job outlived the grace period after a stop signal."""
    deadline = None
    while True:
        codes = [agent.poll() for agent in agents]
        if all(code is not None for code in codes):
            return codes
        if received and deadline is None:
            deadline = time.monotonic() + GRACE_SECONDS
        if deadline is not None and time.monotonic() > deadline:
            return None
        time.sleep(0.2)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
