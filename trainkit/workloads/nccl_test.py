"""`invoke nccl-test`: prove the fabric before paying for a long run.

A collective sweep (training/comms/sweep.py: all-reduce, all-gather, reduce-scatter over message sizes) on the
same nodes and processes a training job would use, reported like nccl-tests (time, algbw, busbw per size) as
results.json, table.md and busbw.png under runs/<id>/ (training/comms/report.py, written where the sweep ran).
Locally it runs over gloo (CPU) or NCCL (local GPUs) on `--nodes` torchrun agents of this machine. On EKS it is
a PyTorchJob on the training jobs' placement (image, node selector, 8 GPUs and the EFA devices of the instance
type per pod, the platform's etcd rendezvous) whose workers run torchrun on the sweep, writing to FSx. There the
sweep expects EFA: it fails unless every rank's NCCL used the libfabric plugin over EFA, naming the cause
(training/comms/nccl_log.py), and warns when the largest all-reduce at or above the published size is below
half the published figure for the instance type.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

from trainkit import hardware
from trainkit.backends.local.backend import free_port
from trainkit.errors import SpecError
from trainkit.run.prepare import PreparedRun
from trainkit.run.torchrun import rdzv_conf, rendezvous_id, torchrun_command

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


def run_local(nodes: int, nproc: int, out: Path, worker_args: list[str], timeout_s: float) -> None:
    from training.comms.sweep import RESULTS

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
    if not (out / RESULTS).is_file():  # a failed verdict exits non-zero too, after writing the report
        raise RuntimeError(f"the collective sweep failed (agent exit codes {codes}); logs: {out / 'logs'}")


def sizes(gpus: bool, min_size: str | None, max_size: str | None) -> tuple[int, int]:
    low, high = GPU_RANGE if gpus else CPU_RANGE
    return parse_size(min_size or low, "--min-bytes"), parse_size(max_size or high, "--max-bytes")


def new_run_id() -> str:
    return f"nccl-test-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:4]}"


def run(
    nodes: int,
    nproc: int,
    runs_dir: str,
    ops: str,
    min_size: str | None,
    max_size: str | None,
    iters: int,
    warmup: int,
    timeout_s: float = 1800.0,
) -> tuple[Path, list[str], bool]:
    """The local sweep: (run folder, lines to print, passed). Nothing is expected of this machine's network."""
    from training.comms.report import table, verdict_lines
    from training.comms.sweep import RESULTS

    gpus = hardware.local_gpu_count()
    min_bytes, max_bytes = sizes(bool(gpus), min_size, max_size)
    chosen = check_inputs(nodes, nproc, ops, min_bytes, max_bytes, iters)
    if gpus and nodes * nproc > gpus:
        raise SpecError(f"--nodes {nodes} x --nproc {nproc} is more processes than this machine's {gpus} GPUs")
    out = Path(runs_dir) / new_run_id()
    run_local(nodes, nproc, out, sweep_args(",".join(chosen), min_bytes, max_bytes, iters, warmup), timeout_s)
    record = json.loads((out / RESULTS).read_text())
    lines = [*table(record), "", *verdict_lines(record)]
    lines.append(f"results: {out / RESULTS}, {out / 'table.md'}, {out / 'busbw.png'}")
    return out, lines, not record["verdict"]["failures"]


def eks_workload(job, rdzv_id: str, args: list[str]):
    """The sweep under torchrun in every worker pod: the same rendezvous as a training job's, no restarts (a
    fabric test that fails must fail the job), each agent's logs on FSx under runs/<id>/logs/<pod>."""
    from trainkit.backends.eks.render import Workload, rdzv_endpoint, worker_env

    run = PreparedRun(job=job, module="training.comms.sweep", args=["--out", str(job.run_dir), *args])
    log_dir = job.run_dir / "logs" / "$(POD_NAME)"  # the kubelet expands $(VAR) from the container's env
    command = torchrun_command(run, rdzv_endpoint(job), rdzv_id, log_dir, run.args)
    return Workload("nccl-test", ["python", *command[1:3]], command[3:], worker_env(), restart_policy="Never")


def submit_eks(
    nodes: int,
    nproc: int | None,
    placement: dict,
    ops: str,
    min_size: str | None,
    max_size: str | None,
    iters: int,
    warmup: int,
    dry_run: bool,
) -> str:
    """Submit the sweep as a PyTorchJob (or, `dry_run`, return its YAML); `placement`: instance_type, image,
    namespace, rdzv, rdzv_endpoint and run_id flags as `invoke train` takes them."""
    from trainkit.backends import job_from_flags
    from trainkit.backends.eks.backend import manifest_yaml, submit

    min_bytes, max_bytes = sizes(True, min_size, max_size)
    flags = {key: value for key, value in placement.items() if value is not None}
    flags.update(target="eks", nodes=nodes, min_nodes=nodes, nproc=nproc, max_restarts=0, metrics_port=0)
    flags.setdefault("run_id", new_run_id())
    job = job_from_flags(flags)
    chosen = check_inputs(nodes, job.parallelism.nproc, ops, min_bytes, max_bytes, iters)
    args = sweep_args(",".join(chosen), min_bytes, max_bytes, iters, warmup)
    rdzv_id = rendezvous_id(job)
    workload = eks_workload(job, rdzv_id, args + expectations(job.placement.instance_type, nodes))
    for note in job.run.notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    if dry_run:
        return manifest_yaml(job, workload, rdzv_id)
    return submit(job, workload=workload, rdzv_id=rdzv_id) + (
        f"\nthe report: runs/{job.run.run_id}/table.md, results.json, busbw.png on FSx; the table also ends the "
        "leader's log"
    )
