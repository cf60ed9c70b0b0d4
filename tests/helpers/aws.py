"""An AWS emulator for the tests: moto's server on 127.0.0.1, and the fake credentials that go with it."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.waiting import wait_until_serving

FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


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
