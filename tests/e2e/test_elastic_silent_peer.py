"""The collective timeout with real processes: two ranks under torchrun, one of which goes silent."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.paths import HELPERS, REPO


def test_a_silent_peer_fails_the_collective_after_the_timeout_instead_of_hanging():
    """Rank 1 stops answering without closing its connections; rank 0's all-reduce must fail in time."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:0",
        str(HELPERS / "silent_peer.py"),
        "--timeout",
        "3",
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "rank 0: collective failed after" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    waited = float(result.stdout.split("collective failed after")[1].split()[0])
    assert 2.5 <= waited <= 30, waited
