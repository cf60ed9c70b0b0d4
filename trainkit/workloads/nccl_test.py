"""`invoke nccl-test`: prove the fabric before paying for a long run.

A collective sweep (training/comms/sweep.py: all-reduce, all-gather, reduce-scatter over message sizes) on the
same nodes and processes a training job would use, reported like nccl-tests (time, algbw, busbw per size) as
results.json, table.md and busbw.png under runs/<id>/ (training/comms/report.py, written where the sweep ran).
It is a workload like a recipe: the backend of `--target` runs it as it runs training, with a run folder, the
run lock, `invoke status / logs / stop` and no restarts. Locally over gloo (CPU) or NCCL (local GPUs) on
`--nodes` torchrun agents of this machine; on EKS as a PyTorchJob on the training jobs' placement (image, node
selector, 8 GPUs and the EFA devices of the instance type per pod, the platform's etcd rendezvous), writing to
FSx. On an instance type of the table the sweep expects EFA: it fails unless every rank's NCCL used the libfabric
plugin over EFA, naming the cause (training/comms/nccl_log.py), and warns when the largest all-reduce at or above
the published size is below half the published figure for the instance type.
"""

from __future__ import annotations

import re
import time
import uuid

from training.spec import Job
from trainkit import hardware
from trainkit.errors import SpecError
from trainkit.run.workload import Workload

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
    from training.comms.sweep import OPS

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


def sweep_args(ops: str, min_bytes: int, max_bytes: int, iters: int, warmup: int) -> list[str]:
    return [
        *("--ops", ops, "--min-bytes", str(min_bytes), "--max-bytes", str(max_bytes)),
        *("--iters", str(iters), "--warmup", str(warmup)),
    ]


def expectations(instance_type: str, nodes: int) -> list[str]:
    """The worker's --expect-* arguments for an instance type: EFA where it has EFA devices; the published
    two-node all-reduce figure where one exists and the sweep spans nodes."""
    args = ["--expect-efa"] if hardware.INSTANCE_TYPES[instance_type].efa_interfaces else []
    if nodes >= 2 and instance_type in PUBLISHED:
        size, gbps = PUBLISHED[instance_type]
        args += ["--expect-busbw", f"{size}:{gbps}"]
    return args


def sizes(gpus: bool, min_size: str | None, max_size: str | None) -> tuple[int, int]:
    low, high = GPU_RANGE if gpus else CPU_RANGE
    return parse_size(min_size or low, "--min-bytes"), parse_size(max_size or high, "--max-bytes")


def new_run_id() -> str:
    return f"nccl-test-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:4]}"


def workload(
    job: Job, gpus: bool, ops: str, min_size: str | None, max_size: str | None, iters: int, warmup: int
) -> Workload:
    """The sweep on the job's nodes and processes, with nothing retried (a fabric test that fails must fail the
    job); on an instance type of the table, what its fabric should show (`expectations`). `gpus`: whether the
    target's nodes have GPUs (NCCL sizes), else gloo's smaller range."""
    min_bytes, max_bytes = sizes(gpus, min_size, max_size)
    chosen = check_inputs(job.parallelism.nodes, job.parallelism.nproc, ops, min_bytes, max_bytes, iters)
    args = sweep_args(",".join(chosen), min_bytes, max_bytes, iters, warmup)
    instance_type = job.placement.instance_type
    if instance_type is not None:
        args += expectations(instance_type, job.parallelism.nodes)
    return Workload(
        label="nccl-test",
        module="training.comms.sweep",
        args=("--out", str(job.run_dir), *args),
        prepare="trainkit.run.prepare:prepare_folder",
        restarts=False,
        outputs=("results.json", "table.md", "busbw.png"),
        token=False,
    )
