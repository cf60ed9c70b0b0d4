"""Resume failures that must set a checkpoint aside, or end every rank at once, instead of crashing or hanging.

- DCP gathers every rank's load error into a CheckpointException, a BaseException (torch/distributed/checkpoint/
  api.py), which an `except Exception` lets through: the resume then crashed instead of setting the checkpoint aside.
- DeepSpeed's universal conversion runs on one rank while the others wait: when it raised there, the others waited in
  a barrier the owner never reached, until the collective timeout (and the owner went on to another collective).
  Here two real gloo processes: both end within seconds, the owner with its error, the other saying where it was.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

from torch.distributed.checkpoint import CheckpointException

from tests.helpers.paths import REPO
from training.common.checkpoint import CheckpointManager
from training.common.run import RunContext


def test_a_load_error_dcp_gathers_sets_the_checkpoint_aside_named_by_its_cause(tmp_path):
    manager = CheckpointManager(tmp_path / "checkpoints", keep=2, is_main=True, barrier=lambda: None)
    manager.save(4, lambda folder: (folder / "shard.distcp").write_bytes(b"0" * 64), {"restarts": 0})
    (checkpoint,) = [path for path in (tmp_path / "checkpoints").iterdir() if path.name.startswith("step-")]

    def load(_folder):
        failure = OSError(5, "Input/output error")
        raise CheckpointException("load", {1: (failure, traceback.extract_stack()), 3: (ValueError("x"), None)})

    context = RunContext.__new__(RunContext)  # the two things _unusable reads; the rest needs an Accelerator
    context.state = SimpleNamespace(load=load, safe_globals=())
    context.accelerator = SimpleNamespace(device="cpu")
    assert context._unusable(checkpoint) == "it does not load: OSError: [Errno 5] Input/output error"


RANK = r"""
import json, os, sys, datetime
from pathlib import Path
import torch
import torch.distributed as dist
from training.common import zero

rank, root = int(sys.argv[1]), Path(sys.argv[2])
os.environ["LOCAL_RANK"] = str(rank)
dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=120))

def fails(source, output):
    raise ValueError(f"bad shard in {source.parent.name}")

zero.convert_to_universal = fails
checkpoint = root / "checkpoints" / "step-00000004"
try:
    zero.universal_copy(checkpoint, 1, 2, rank)
    outcome = "converted"
except Exception as error:
    outcome = f"{type(error).__name__}: {error}"
# what the resume does next on every rank whose load failed: agree on it (RunContext._unusable, one MAX all-reduce)
flag = torch.tensor([1.0])
dist.all_reduce(flag, op=dist.ReduceOp.MAX)
(root / f"rank{rank}.json").write_text(json.dumps(outcome))
# as a finished worker leaves: torch's native threads sometimes abort an interpreter teardown ("terminate called
# without an active exception", exit -6; training/common/lifecycle.py)
from training.common.lifecycle import exit_finished
exit_finished()
"""


def test_a_failed_universal_conversion_ends_every_rank_at_once(tmp_path):
    (tmp_path / "checkpoints" / "step-00000004").mkdir(parents=True)
    started = time.monotonic()
    ranks = [
        subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(tmp_path)], cwd=REPO, stderr=subprocess.PIPE)
        for rank in (0, 1)
    ]
    try:
        for process in ranks:  # well inside the collective timeout (120 s here), which the ranks used to wait out
            assert process.wait(timeout=60) == 0, process.stderr.read().decode()[-2000:]
    finally:
        for process in ranks:
            process.kill()
    assert time.monotonic() - started < 60
    outcomes = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert outcomes == [
        "ValueError: bad shard in step-00000004",
        "RuntimeError: DeepSpeed's universal conversion of step-00000004 failed on the rank that made it",
    ]
    assert not Path(tmp_path / "checkpoints" / ".universal" / "step-00000004" / "global_step").exists()
