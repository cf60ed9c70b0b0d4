"""torchrun finds trainkit's etcd rendezvous backend through the package's entry point (a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.paths import REPO


def test_torchrun_finds_the_etcd_backend_through_the_entry_point():
    code = "from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as r; print(r._registry)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert "trainkit-etcd" in out
