"""`invoke nccl-test` (top level): the collective sweep that proves the fabric before a long run."""

from __future__ import annotations

from invoke import Exit, task

from .options import user_errors


@task(
    name="nccl-test",
    help={
        "nodes": "Nodes (local: torchrun agents on this machine); default 2.",
        "nproc": "Processes per node (default: the machine's GPUs, else 2).",
        "target": "local (gloo on CPU, NCCL on local GPUs). The EKS job comes with the training image's push.",
        "ops": "Comma list of all_reduce, all_gather, reduce_scatter (default all three).",
        "min-bytes": "Smallest message, e.g. 8, 64K (default: 8 on GPUs, 1K on CPU).",
        "max-bytes": "Largest message, e.g. 16G (default: 16G on GPUs, 4M on CPU).",
        "iters": "Timed iterations per size (default 20); warmup: untimed ones before them (default 5).",
        "runs-dir": "Where runs/<nccl-test-...>/ goes (default runs).",
    },
)
@user_errors
def nccl_test(
    c,
    nodes=2,
    nproc=None,
    target="local",
    ops="all_reduce,all_gather,reduce_scatter",
    min_bytes=None,
    max_bytes=None,
    iters=20,
    warmup=5,
    runs_dir="runs",
):
    """Collective sweep (all-reduce, all-gather, reduce-scatter): time, algbw, busbw per size, as nccl-tests."""
    from .. import hardware, nccltest
    from ..errors import SpecError

    if target != "local":
        raise SpecError(f"--target {target}: only local so far (the EKS job is not built yet)")
    per_node = int(nproc) if nproc is not None else (hardware.local_gpu_count() or 2)
    out, lines, ok = nccltest.run(int(nodes), per_node, runs_dir, ops, min_bytes, max_bytes, int(iters), int(warmup))
    print("\n".join(lines))
    if not ok:
        raise Exit(f"nccl-test failed: see {out}", code=1)


TASKS = [nccl_test]
