"""Ranks that each found their own newest checkpoint (hosts that share no disk) resume from one step: the oldest of
them, or none at all when one rank has none (training/common/run.py, agreed_step), over a real gloo group."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.containers import free_port
from tests.helpers.paths import REPO

AGREE = """
import os, sys
import torch.distributed as dist
from training.common.run import agreed_step

dist.init_process_group("gloo")
mine = [None if value == "none" else int(value) for value in sys.argv[1:]][dist.get_rank()]
print(dist.get_rank(), agreed_step(mine), flush=True)
"""


def agree(*steps: str) -> set[str]:
    port = free_port()
    processes = []
    for rank in range(len(steps)):
        env = {"RANK": str(rank), "WORLD_SIZE": str(len(steps)), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        command = [sys.executable, "-c", AGREE, *steps]
        processes.append(subprocess.Popen(command, env={**env, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE))
    return {process.communicate(timeout=60)[0].decode().strip() for process in processes}


def test_ranks_resume_from_the_oldest_newest_step_and_none_when_one_rank_has_none():
    assert agree("20", "10") == {"0 10", "1 10"}  # algo-2 fell back to 10: algo-1 does too
    assert agree("20", "none") == {"0 None", "1 None"}
