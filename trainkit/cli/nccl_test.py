"""`invoke nccl-test` (top level): the collective sweep that proves the fabric before a long run."""

from __future__ import annotations

from trainkit.cli.options import task, user_errors


@task(
    name="nccl-test",
    help={
        "nodes": "Nodes (local: torchrun agents on this machine; eks: worker pods, one per instance); default 2.",
        "nproc": "Processes per node (default: local, the machine's GPUs, else 2; eks, the instance type's GPUs).",
        "target": "local (gloo on CPU, NCCL on local GPUs), eks (a PyTorchJob on the training jobs' placement), "
        "sagemaker or batch (a job of theirs on the instance type, run once).",
        "ops": "Comma list of all_reduce, all_gather, reduce_scatter (default all three).",
        "min-bytes": "Smallest message, e.g. 8, 64K (default: 8 on GPUs, 1K on CPU).",
        "max-bytes": "Largest message, e.g. 16G (default: 16G on GPUs, 4M on CPU).",
        "iters": "Timed iterations per size (default 20); warmup: untimed ones before them (default 5).",
        "runs-dir": "Where runs/<run id>/ goes (default runs; eks: on FSx).",
        "instance-type": "eks: as for invoke train (default: the cluster's GPU node type).",
        "image": "eks: the training image (default: the one `invoke images.push` recorded).",
        "namespace": "eks: namespace of the job (default: the training jobs').",
        "rdzv": "c10d (local default; eks: a store on worker 0) or etcd (eks default: the platform's).",
        "rdzv-endpoint": "host:port of the rendezvous (eks default: the platform's etcd service).",
        "run-id": "Name of the run and its folder (default nccl-test-<time>-<hex>).",
        "dry-run": "Print what would run and create nothing (local: the job and the workload; eks: the PyTorchJob).",
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
    from trainkit.backends import resolve_job
    from trainkit.workloads import nccl_test as sweep

    placement = {"instance_type": instance_type, "image": image, "namespace": namespace, "rdzv": rdzv}
    flags = {
        **placement,
        "rdzv_endpoint": rdzv_endpoint,
        "workload": "nccl-test",
        "target": target,
        "nodes": nodes,
        "min_nodes": nodes,
        "nproc": nproc,
        "runs_dir": runs_dir,
        "run_id": run_id or sweep.new_run_id(),
        "max_restarts": 0,
        "metrics_port": 0,
    }
    job, backend, machine = resolve_job(flags)  # build drops the options left None
    gpus = machine.gpus_per_node > 0
    workload = sweep.workload(job, gpus, ops, min_bytes, max_bytes, int(iters), int(warmup))
    backend.submit(job, workload, dry_run=dry_run)  # a failed sweep raises JobFailed: its cause, its exit code


TASKS = [nccl_test]
