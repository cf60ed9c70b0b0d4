"""`invoke nccl-test`: prove the fabric before paying for a long run.

A collective sweep (training/comms/sweep.py: all-reduce, all-gather, reduce-scatter over message sizes) on the
same nodes and processes a training job would use, reported like nccl-tests (time, algbw, busbw per size) as
results.json, table.md and busbw.png under runs/<id>/. Locally it runs over gloo (CPU) or NCCL (local GPUs) on
`--nodes` torchrun agents of this machine. On GPUs every rank's NCCL init log is checked: on an instance type
with EFA the test fails unless NCCL used the libfabric plugin over EFA, and names the cause
(training/comms/nccl_log.py); the largest all-reduce at or above the published size is compared with the
published figure for the instance type (warning below half).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

from training.comms.sweep import OPS, RESULTS

from . import hardware
from .backends.local import free_port
from .errors import SpecError
from .torchrun import rdzv_conf

GIB = 2**30
# Published all_reduce_perf busbw between two nodes (GB/s, float sum, out-of-place), at the message size given:
# aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/README.md (commit 7217859, 2026-02-21),
# 2 x p5.48xlarge (EFA, 3,200 Gbps) and 2 x p4de.24xlarge (400 Gbps; p4d has the same EFA).
PUBLISHED = {
    "p5.48xlarge": (2 * GIB, 443.7),
    "p5e.48xlarge": (2 * GIB, 443.7),
    "p4de.24xlarge": (2 * GIB, 78.33),
    "p4d.24xlarge": (2 * GIB, 78.33),
}
SIZE = re.compile(r"(\d+)([KMG]?)(i?B?)?", re.IGNORECASE)
CPU_RANGE = ("1K", "4M")  # gloo over loopback: small enough for a 2-core machine
GPU_RANGE = ("8", "16G")  # nccl-tests' usual -b 8 -e 16G


def parse_size(text: str, flag: str) -> int:
    match = SIZE.fullmatch(str(text).strip())
    if not match or int(match[1]) <= 0:
        raise SpecError(f"{flag} {text!r}: a positive size in bytes, or with K, M, G (binary), e.g. 8, 64K, 16G")
    return int(match[1]) * {"": 1, "K": 2**10, "M": 2**20, "G": GIB}[match[2].upper()]


def check_inputs(nodes: int, nproc: int, ops: str, min_bytes: int, max_bytes: int, iters: int) -> list[str]:
    chosen = [op.strip() for op in ops.split(",") if op.strip()]
    unknown = [op for op in chosen if op not in OPS]
    if unknown or not chosen:
        raise SpecError(f"--ops {ops!r}: a comma list of {', '.join(OPS)}")
    if nodes < 1 or nproc < 1:
        raise SpecError(f"--nodes {nodes} --nproc {nproc}: both at least 1")
    if nodes * nproc < 2:
        raise SpecError("a collective test needs at least two processes: raise --nodes or --nproc")
    if min_bytes > max_bytes:
        raise SpecError(f"--min-bytes ({min_bytes}) is above --max-bytes ({max_bytes})")
    if iters < 1:
        raise SpecError(f"--iters {iters}: at least 1")
    return chosen


def node_commands(nodes: int, nproc: int, out: Path, worker_args: list[str]) -> list[list[str]]:
    """One torchrun agent per node on this machine, meeting at a c10d rendezvous that node 0 hosts."""
    endpoint, rdzv_id = f"127.0.0.1:{free_port()}", f"nccl-test-{uuid.uuid4().hex[:8]}"
    commands = []
    for node in range(nodes):
        commands.append(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node", str(nproc)]
            + ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]
            + ["--rdzv-conf", rdzv_conf("c10d", is_host=node == 0), "--max-restarts", "0"]
            + ["-m", "training.comms.sweep", "--out", str(out), *worker_args]
        )
    return commands


def run_local(nodes: int, nproc: int, out: Path, worker_args: list[str], timeout_s: float) -> None:
    (out / "logs").mkdir(parents=True, exist_ok=True)
    agents = []
    for node, command in enumerate(node_commands(nodes, nproc, out, worker_args)):
        log = (out / "logs" / f"node-{node}.log").open("w")
        agents.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + timeout_s
    codes = []
    for process, log in agents:
        try:
            codes.append(process.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            process.kill()
            codes.append(process.wait())
        log.close()
    if any(codes) or not (out / RESULTS).is_file():
        raise RuntimeError(f"the collective sweep failed (agent exit codes {codes}); logs: {out / 'logs'}")


def table(record: dict) -> list[str]:
    lines = [
        f"{record['backend']} on {record['device']}: {record['world_size']} processes, {record['nodes']} node(s), "
        f"{record['dtype']}; {record['timing']}",
        "",
        "| op | size (B) | time (us) | algbw (GB/s) | busbw (GB/s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in record["results"]:
        lines.append(
            f"| {row['op']} | {row['size_bytes']} | {row['time_us']:.1f} | {row['algbw_gbps']:.3f} | "
            f"{row['busbw_gbps']:.3f} |"
        )
    return lines


def plot(record: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4.5))
    for op in dict.fromkeys(row["op"] for row in record["results"]):
        rows = [row for row in record["results"] if row["op"] == op]
        axis.plot([r["size_bytes"] for r in rows], [r["busbw_gbps"] for r in rows], marker="o", label=op)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("message size (bytes)")
    axis.set_ylabel("busbw (GB/s)")
    axis.set_title(f"{record['backend']}: {record['world_size']} processes on {record['nodes']} node(s)")
    axis.grid(True, alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def verdict(record: dict, instance_type: str | None) -> tuple[list[str], list[str]]:
    """(failures, warnings): EFA not used on an instance type that has it; busbw below half the published."""
    failures, warnings = [], []
    shape = hardware.INSTANCE_TYPES.get(instance_type) if instance_type else None
    for rank, net in sorted(record.get("net", {}).items()):
        if shape is not None and shape.efa_interfaces and not net["efa"]:
            failures.append(f"{rank}: NCCL did not use EFA (network {net['network']}): {net['cause']}")
    published = PUBLISHED.get(instance_type or "")
    if published and record["nodes"] >= 2:
        size, expected = published
        measured = [r for r in record["results"] if r["op"] == "all_reduce" and r["size_bytes"] >= size * 0.99]
        if measured and measured[-1]["busbw_gbps"] < expected / 2:
            warnings.append(
                f"all_reduce busbw {measured[-1]['busbw_gbps']:.1f} GB/s at {measured[-1]['size_bytes']} B is below "
                f"half of the published {expected} GB/s for 2 x {instance_type} at {size} B"
            )
    return failures, warnings


def run(
    nodes: int,
    nproc: int,
    runs_dir: str,
    ops: str,
    min_size: str | None,
    max_size: str | None,
    iters: int,
    warmup: int,
    instance_type: str | None = None,
    timeout_s: float = 1800.0,
) -> tuple[Path, list[str], bool]:
    """The local sweep: (run folder, lines to print, passed)."""
    gpus = hardware.local_gpu_count()
    low, high = GPU_RANGE if gpus else CPU_RANGE
    min_bytes, max_bytes = parse_size(min_size or low, "--min-bytes"), parse_size(max_size or high, "--max-bytes")
    chosen = check_inputs(nodes, nproc, ops, min_bytes, max_bytes, iters)
    if gpus and nodes * nproc > gpus:
        raise SpecError(f"--nodes {nodes} x --nproc {nproc} is more processes than this machine's {gpus} GPUs")
    out = Path(runs_dir) / f"nccl-test-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:4]}"
    args = ["--ops", ",".join(chosen), "--min-bytes", str(min_bytes), "--max-bytes", str(max_bytes)]
    run_local(nodes, nproc, out, [*args, "--iters", str(iters), "--warmup", str(warmup)], timeout_s)
    record = json.loads((out / RESULTS).read_text())
    lines = table(record)
    (out / "table.md").write_text("\n".join(lines) + "\n")
    plot(record, out / "busbw.png")
    failures, warnings = verdict(record, instance_type)
    lines += [""] + [f"warning: {w}" for w in warnings] + [f"FAILED: {f}" for f in failures]
    lines.append(f"results: {out / RESULTS}, {out / 'table.md'}, {out / 'busbw.png'}")
    return out, lines, not failures
