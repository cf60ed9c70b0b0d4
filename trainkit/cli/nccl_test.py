"""`invoke nccl-test` (top level): the collective sweep that proves the fabric before a long run."""

from __future__ import annotations

from invoke import Exit, task

from trainkit.cli.options import user_errors

EKS_ONLY = ("instance_type", "image", "namespace", "rdzv", "rdzv_endpoint", "run_id", "dry_run")


@task(
    name="nccl-test",
    help={
        "nodes": "Nodes (local: torchrun agents on this machine; eks: worker pods, one per instance); default 2.",
        "nproc": "Processes per node (default: local, the machine's GPUs, else 2; eks, the instance type's GPUs).",
        "target": "local (gloo on CPU, NCCL on local GPUs) or eks (a PyTorchJob on the training jobs' placement).",
        "ops": "Comma list of all_reduce, all_gather, reduce_scatter (default all three).",
        "min-bytes": "Smallest message, e.g. 8, 64K (default: 8 on GPUs, 1K on CPU).",
        "max-bytes": "Largest message, e.g. 16G (default: 16G on GPUs, 4M on CPU).",
        "iters": "Timed iterations per size (default 20); warmup: untimed ones before them (default 5).",
        "runs-dir": "local: where runs/<nccl-test-...>/ goes (default runs). eks: runs/<run id>/ on FSx.",
        "instance-type": "eks: as for invoke train (default: the cluster's GPU node type).",
        "image": "eks: the training image (default: the one `invoke images.push` recorded).",
        "namespace": "eks: namespace of the job (default: the training jobs').",
        "rdzv": "eks: etcd (default, the platform's) or c10d (a store on worker 0).",
        "rdzv-endpoint": "eks: host:port of the rendezvous (default: the platform's etcd service).",
        "run-id": "eks: name of the run and its folder on FSx (default nccl-test-<time>-<hex>).",
        "dry-run": "eks: print the PyTorchJob as YAML and create nothing.",
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
    instance_type=None,
    image=None,
    namespace=None,
    rdzv=None,
    rdzv_endpoint=None,
    run_id=None,
    dry_run=False,
):
    """Collective sweep (all-reduce, all-gather, reduce-scatter): time, algbw, busbw per size, as nccl-tests."""
    from trainkit import hardware
    from trainkit.errors import SpecError
    from trainkit.workloads import nccl_test as nccltest

    eks_only = {key: value for key, value in locals().items() if key in EKS_ONLY}
    if target == "eks":
        placement = {key: value for key, value in eks_only.items() if key != "dry_run"}
        per_node = int(nproc) if nproc is not None else None
        print(
            nccltest.submit_eks(
                int(nodes), per_node, placement, ops, min_bytes, max_bytes, int(iters), int(warmup), dry_run
            )
        )
        return
    if target != "local":
        raise SpecError(f"--target {target!r}: local or eks")
    given = [key for key, value in eks_only.items() if value not in (None, False)]
    if given:
        flags = ", ".join("--" + key.replace("_", "-") for key in given)
        raise SpecError(f"{flags}: for --target eks only")
    per_node = int(nproc) if nproc is not None else (hardware.local_gpu_count() or 2)
    out, lines, ok = nccltest.run(int(nodes), per_node, runs_dir, ops, min_bytes, max_bytes, int(iters), int(warmup))
    print("\n".join(lines))
    if not ok:
        raise Exit(f"nccl-test failed: see {out}", code=1)


TASKS = [nccl_test]
