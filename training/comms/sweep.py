"""The collective sweep behind `invoke nccl-test`, one process per GPU (or CPU slot) under torchrun.

Timed the way NVIDIA's nccl-tests time theirs (doc/PERFORMANCE.md at v2.19.6): a message of S bytes takes t
seconds per operation; algbw = S / t and busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather and
reduce-scatter, where S is the whole buffer (n times each rank's part, as nccl-tests' size column is). GB/s
means 1e9 bytes/s. t is the mean over the timed iterations on each rank, then the largest over the ranks (the
slowest rank is when the operation is done). float32 elements; S is rounded down to a multiple of 4 x n bytes.

NCCL (GPUs) writes its init log per rank under <out>/nccl/ (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET); rank 0
checks every rank's log for the libfabric plugin over EFA (training/comms/nccl_log.py), judges the sweep against
the launcher's expectations (--expect-efa, --expect-busbw; training/comms/report.py) and writes table.md,
busbw.png and, last, results.json to <out>. Every rank then exits 1 if the verdict failed, so that a job on a
cluster fails on every node. gloo (CPU) has no init log.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from training.common.files import publish_text
from training.comms import report
from training.comms.nccl_log import check_init_log

OPS = ("all_reduce", "all_gather", "reduce_scatter")
RESULTS = "results.json"


def bus_factor(op: str, world: int) -> float:
    return 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world


def message_sizes(min_bytes: int, max_bytes: int, world: int) -> list[int]:
    """Powers of two from min to max, each rounded down to whole float32 parts per rank (at least one each)."""
    unit, sizes, size = 4 * world, [], max(1, min_bytes)
    while size <= max_bytes:
        rounded = max(unit, size - size % unit)
        if not sizes or rounded != sizes[-1]:
            sizes.append(rounded)
        size *= 2
    return sizes


def bandwidths(op: str, size_bytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one operation on a whole buffer of `size_bytes` taking `seconds`."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * bus_factor(op, world)


def _operation(op: str, size_bytes: int, world: int, device: torch.device):
    whole = torch.ones(size_bytes // 4, device=device)
    part = torch.ones(size_bytes // 4 // world, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(whole)
    # torch 2.13 names them *_single (the *_tensor names are deprecated there); torch 2.11 has only *_tensor
    if op == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(whole, part)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return lambda: scatter(part, whole)


def _timed(run, iters: int, warmup: int, device: torch.device) -> float:
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        run()
    sync()
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        run()
    sync()
    mean = torch.tensor([(time.perf_counter() - started) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    return float(mean.item())


def sweep(ops: list[str], sizes: list[int], iters: int, warmup: int, device: torch.device) -> list[dict]:
    world, rows = dist.get_world_size(), []
    for op in ops:
        for size in sizes:
            seconds = _timed(_operation(op, size, world, device), iters, warmup, device)
            algbw, busbw = bandwidths(op, size, seconds, world)
            rows.append(
                {"op": op, "size_bytes": size, "time_us": seconds * 1e6, "algbw_gbps": algbw, "busbw_gbps": busbw}
            )
    return rows


def expected_busbw(text: str | None) -> tuple[int, float] | None:
    """--expect-busbw SIZE:GBPS (bytes, GB/s)."""
    if not text:
        return None
    size, _, gbps = text.partition(":")
    return int(size), float(gbps)


def publish(out: Path, record: dict) -> None:
    """table.md and busbw.png, then results.json (the file a launcher waits for), each whole or absent."""
    publish_text(out / "table.md", "\n".join(report.table(record)) + "\n")
    partial = out / ".busbw.png.partial"
    os.replace(report.plot(record, partial), out / "busbw.png")
    publish_text(out / RESULTS, json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--min-bytes", type=int, required=True)
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--expect-efa", action="store_true", help="fail unless every rank's NCCL used EFA")
    parser.add_argument("--expect-busbw", help="SIZE:GBPS: warn when all-reduce busbw at SIZE is below half GBPS")
    args = parser.parse_args(argv)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0))
    gpu = torch.cuda.is_available()
    if gpu:  # before the communicator exists: NCCL reads these when it initialises
        (args.out / "nccl").mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("NCCL_DEBUG", "INFO")
        os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
        log = args.out / "nccl" / f"rank-{rank}.log"
        log.unlink(missing_ok=True)  # a reused run folder's log must not stand in for this run's
        os.environ["NCCL_DEBUG_FILE"] = str(log)
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    dist.init_process_group("nccl" if gpu else "gloo", device_id=device if gpu else None)
    world = dist.get_world_size()
    ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    rows = sweep(ops, message_sizes(args.min_bytes, args.max_bytes, world), args.iters, args.warmup, device)
    dist.barrier()  # every rank's NCCL log is written
    failed = torch.zeros(1, device=device)
    if rank == 0:
        record = {
            "backend": dist.get_backend(),
            "device": torch.cuda.get_device_name(device) if gpu else "cpu",
            "world_size": world,
            "nodes": int(os.environ.get("GROUP_WORLD_SIZE", 1)),
            "dtype": "float32",
            "timing": "per operation: mean over the timed iterations, largest over the ranks",
            "iters": args.iters,
            "warmup": args.warmup,
            "results": rows,
        }
        if gpu:
            logs = [args.out / "nccl" / f"rank-{r}.log" for r in range(world)]  # every rank's, none missing
            checks = {
                log.stem: check_init_log(log.read_text(errors="replace") if log.is_file() else "") for log in logs
            }
            record["net"] = {name: {"network": c.network, "efa": c.efa, "cause": c.cause} for name, c in checks.items()}
        expect = expected_busbw(args.expect_busbw)
        record["expected"] = {"efa": args.expect_efa, "busbw": list(expect) if expect else None}
        failures, warnings = report.verdict(record, args.expect_efa, expect)
        record["verdict"] = {"failures": failures, "warnings": warnings}
        publish(args.out, record)
        print("\n".join(report.table(record) + [""] + report.verdict_lines(record)), flush=True)
        failed += bool(failures)
    dist.all_reduce(failed)  # also keeps every rank (and pod) alive until rank 0 has published
    code = 1 if failed.item() else 0  # read (and so waited for) before the communicator goes
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
