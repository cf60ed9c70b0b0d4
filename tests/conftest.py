"""Shared helpers: run the product the way a user does (invoke / make) and read what it leaves."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainkit.services import free_port_pair

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def invoke(
    *args: str, env: dict | None = None, timeout: float = 600, drop_env_prefix: str | None = None
) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not (drop_env_prefix and k.startswith(drop_env_prefix))}
    return subprocess.run(
        [str(BIN / "invoke"), *args],
        cwd=REPO,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


_STARTED: list[subprocess.Popen] = []


def start_invoke(*args: str, env: dict | None = None) -> subprocess.Popen:
    """Start a command in the background; whatever a test leaves running is stopped after it.

    Output goes to a file (a pipe nobody reads would fill up and stall the job); `output(process)`
    reads it.
    """
    log = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen(
        [str(BIN / "invoke"), *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    process.log = log
    _STARTED.append(process)
    return process


def output(process: subprocess.Popen) -> str:
    process.log.seek(0)
    return process.log.read()


@pytest.fixture(autouse=True)
def stop_background_jobs():
    yield
    while _STARTED:
        process = _STARTED.pop()
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # the launcher stops its whole job
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def only_run_dir(runs_dir: Path) -> Path:
    runs = [p for p in runs_dir.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """The first-contact command, `make train MODEL=llama2-tiny`, run once for the session."""
    runs = tmp_path_factory.mktemp("tiny")
    port = free_port_pair()
    result = subprocess.run(
        ["make", "train", "MODEL=llama2-tiny", f"ARGS=--runs-dir {runs} --metrics-port {port}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return only_run_dir(runs)


def wait_until_serving(url: str, server: subprocess.Popen, failure: str, timeout: float) -> None:
    """Poll `url` until the server answers; fail at once if the server process has exited."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise AssertionError(failure) from None
            time.sleep(0.2)


@contextlib.contextmanager
def moto_server(log_path: Path, env: dict | None = None) -> Iterator[str]:
    """An AWS emulator (moto server) on 127.0.0.1; yields its endpoint URL. Real HTTP, real boto3 calls."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = log_path.open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(f"{endpoint}/moto-api/", server, "moto server did not start", timeout=60)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
