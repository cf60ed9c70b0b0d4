"""A plain PyTorch DDP training script, as a user writes one for torchrun, run by trainkit:

    invoke run --script examples/native_ddp.py --nproc 2 -- --epochs 3

It learns a small regression (a two-layer network on a fixed synthetic dataset) with DistributedDataParallel,
a DistributedSampler and SGD; gloo on CPU, NCCL on GPUs. What makes it restartable is the torchrun pattern
(PyTorch's "Fault-tolerant Distributed Training with torchrun" tutorial): a snapshot of the model, optimizer and
step every --save-every steps, written by rank 0 under a temporary name and renamed when complete, and at start
every rank loads the newest snapshot and carries on from its step. trainkit adds where the snapshot lives
(training/script.py: checkpoint_dir(), the same folder after any restart, on any node) and report_step(), which
puts each step in the run's metrics.jsonl and on Prometheus.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from training.script import checkpoint_dir, report_step

SNAPSHOT = "snapshot.pt"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=512, help="Size of the synthetic dataset.")
    parser.add_argument("--batch-size", type=int, default=16, help="Per process.")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--save-every", type=int, default=5, help="Steps between snapshots.")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="Seconds each step waits (to watch it run).")
    return parser.parse_args()


def dataset(samples: int) -> TensorDataset:
    """The same data on every rank and every restart: y = sin(x . w) for fixed w, plus a little noise."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 16, generator=generator)
    w = torch.randn(16, generator=generator)
    y = torch.sin(x @ w).unsqueeze(1) + 0.01 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(x, y)


def save(path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Atomically: a kill in the middle leaves the previous snapshot, never half a file."""
    partial = path.with_name(f".{path.name}.partial")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, partial)
    os.replace(partial, path)


def main() -> None:
    args = arguments()
    device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    snapshot = checkpoint_dir() / SNAPSHOT
    step = 0
    if snapshot.is_file():
        state = torch.load(snapshot, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        if rank == 0:
            print(f"resumed from step {step} ({snapshot})", flush=True)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    data = dataset(args.samples)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    per_epoch = len(loader)
    total = args.epochs * per_epoch
    print(f"rank {rank}: starting at step {step} of {total}", flush=True)
    while step < total:
        epoch, done_in_epoch = divmod(step, per_epoch)
        sampler.set_epoch(epoch)
        for x, y in itertools.islice(loader, done_in_epoch, None):
            loss = nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            report_step(step, loss=mean.item() / dist.get_world_size(), lr=args.lr)
            if rank == 0 and (step % args.save_every == 0 or step == total):
                save(snapshot, model, optimizer, step)
            time.sleep(args.step_sleep)
        if rank == 0:
            mean_loss = mean.item() / dist.get_world_size()
            print(f"epoch {epoch + 1}/{args.epochs}: step {step}/{total}, loss {mean_loss:.4f}", flush=True)
    dist.barrier()  # every rank's last step is in before rank 0's snapshot counts as the end
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
