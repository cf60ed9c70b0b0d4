"""Two ranks; rank 1 goes silent (sleeps, connections open) while rank 0 all-reduces.

Run under torchrun. Rank 0 prints how long the collective waited before failing; with
make_accelerator's collective timeout that is about --timeout seconds, not gloo's 30 minutes.
"""

import argparse
import time

import torch
import torch.distributed as dist

from training.common.distributed import make_accelerator

parser = argparse.ArgumentParser()
parser.add_argument("--timeout", type=float, required=True)
args = parser.parse_args()
accelerator = make_accelerator("NO_SHARD", "fp32", collective_timeout_s=args.timeout)
dist.barrier()
if accelerator.process_index == 1:
    time.sleep(args.timeout * 3)  # silent for longer than the timeout, then gone
else:
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1))
        print("rank 0: collective returned", flush=True)
    except Exception:  # noqa: BLE001 - any failure is what this checks; the time is the point
        print(f"rank 0: collective failed after {time.monotonic() - started:.1f} s", flush=True)
