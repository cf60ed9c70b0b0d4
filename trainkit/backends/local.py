"""Local backend: torchrun on this machine, c10d rendezvous on 127.0.0.1, a unique rendezvous id.

The job runs in its own session (process group). Ctrl-C or SIGTERM to the launcher is forwarded as
SIGTERM to the whole group, which torchrun turns into an orderly stop of every worker; whatever is
still alive after a grace period is killed, so no process outlives the launcher. The exit code is
the job's, or 128 + signal number when it was interrupted.
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rendezvous_id(spec: JobSpec) -> str:
    """Unique per submission: a reused id can meet a closed rendezvous left by an earlier job."""
    return f"{spec.run_id}-{uuid.uuid4().hex[:8]}"


def torchrun_command(run: PreparedRun, endpoint: str) -> list[str]:
    spec = run.spec
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(spec.nodes),
        "--nproc-per-node",
        str(spec.nproc),
        "--rdzv-backend",
        spec.rdzv,
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        rendezvous_id(spec),
        "--max-restarts",
        "0",
        "--log-dir",
        str(spec.run_dir / "logs"),
        "--tee",
        "3",
        "-m",
        run.module,
        *run.args,
    ]


def job_environment(run: PreparedRun) -> dict[str, str]:
    env = dict(os.environ)
    env.update(run.env)
    if hardware.local_gpu_count() == 0 and "OMP_NUM_THREADS" not in env:
        # torchrun defaults every worker to 1 thread; share the cores out instead.
        env["OMP_NUM_THREADS"] = str(max(1, hardware.local_cpu_count() // run.spec.nproc))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class LocalBackend:
    def submit(self, run: PreparedRun) -> int:
        spec = run.spec
        endpoint = spec.rdzv_endpoint or f"127.0.0.1:{free_port()}"
        command = torchrun_command(run, endpoint)
        (spec.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        process = subprocess.Popen(command, env=job_environment(run), start_new_session=True)
        pid_file = spec.run_dir / "launcher.pid"
        pid_file.write_text(f"{process.pid}\n")
        received: list[int] = []

        def forward(signum, _frame):
            received.append(signum)
            # First signal: orderly stop through torchrun. A second one: kill at once.
            _signal_group(process.pid, signal.SIGTERM if len(received) == 1 else signal.SIGKILL)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            code = _wait(process, received)
        finally:
            _signal_group(process.pid, signal.SIGKILL)  # nothing of the job outlives the launcher
            process.wait()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            pid_file.unlink(missing_ok=True)
        if received:
            return 128 + received[0]
        return code if code is not None else 1


def _wait(process: subprocess.Popen, received: list[int]) -> int | None:
    """The job's exit code, or None when it outlived the grace period after a stop signal."""
    deadline = None
    while True:
        try:
            return process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if received and deadline is None:
                deadline = time.monotonic() + GRACE_SECONDS
            if deadline is not None and time.monotonic() > deadline:
                return None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
