"""What the stand-ins' containers share (tests/helpers/batch_standin.py, tests/helpers/sagemaker_standin.py): a
container's entry point run as a local process group, its output to CloudWatch a line at a time, and a stop as a
container runtime stops one (Docker CLI reference, `docker stop`: the container's main process gets SIGTERM, then
SIGKILL after a grace period). Each stand-in keeps its own environment, grace and states, and cites its service's
rules for them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_container(
    command: list[str], cwd: Path, env: dict, on: Callable[[list[str]], list[str]] | None = None
) -> subprocess.Popen:
    """A container's entry point, its first process, in a session of its own (the process group stands for the
    container); `python` is this interpreter. Its output, stdout and stderr together, is read as text. `on`: how
    to run a command on the container's own host (tests/helpers/netns.py, Network.command)."""
    if command[0].startswith("python"):
        command = [sys.executable, *command[1:]]
    return subprocess.Popen(
        on(list(command)) if on else list(command),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def pump_lines(process: subprocess.Popen, put: Callable[[str], None]) -> None:
    """The container's output to `put`, a line at a time until it closes; CloudWatch takes no empty message
    (PutLogEvents: InputLogEvent.message, minimum length 1), so blank lines are left out."""
    for line in process.stdout:
        message = line.rstrip("\n")
        if message:
            put(message)


def running(process: subprocess.Popen | None) -> bool:
    return process is not None and process.poll() is None


def signal_container(process: subprocess.Popen | None, sig: int) -> None:
    """SIGTERM to the container's first process only, which passes it on; SIGKILL to the whole container (the
    process group). Nothing to a container not started or already ended."""
    if running(process):
        with contextlib.suppress(ProcessLookupError):
            if sig == signal.SIGKILL:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)


def kill_after_grace(
    processes: Callable[[], Iterable[subprocess.Popen | None]],
    grace_s: float,
    poll_s: float,
    reap_s: float | None = None,
) -> None:
    """The rest of a stop once SIGTERM is sent: up to `grace_s` (looking every `poll_s`) for the containers to
    exit, then SIGKILL to each still running; with `reap_s`, each is then waited for that long. `processes` is read
    at every look, so a container that starts meanwhile is stopped too."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(running(p) for p in processes()):
        time.sleep(poll_s)
    for process in processes():
        signal_container(process, signal.SIGKILL)
        if reap_s is not None and process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=reap_s)


def processes_with(variable: str) -> list[int]:
    """The live processes whose environment has an entry starting with `variable` (`NAME=value`): what is left of
    a container, whichever session its processes made (torchrun starts each worker in a session of its own)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            entries = environ.read_bytes().split(b"\0")
            if any(entry.startswith(variable.encode()) for entry in entries):
                found.append(int(environ.parent.name))
    return found
