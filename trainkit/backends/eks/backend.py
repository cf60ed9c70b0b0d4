"""EKS backend: the job spec as a PyTorchJob, submitted, followed and stopped through the Kubernetes API.

`submit` runs the preflight checks, then creates the job; `--dry-run` prints the objects as YAML
and touches nothing. `status`, `logs` and `stop` find a run's job by its run-id label (default: the
newest trainkit job in the namespace). Outputs live on FSx and survive `stop`; submitting the same
run id again resumes from the last checkpoint.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

from training.spec import EXPORT_DIR, Job
from trainkit.backends.base import Backend, RunRef, cloud_machine
from trainkit.backends.eks import cluster, idle_guard, nodegroup, preflight, render, rules, submission, task
from trainkit.backends.eks.job_state import deadline_cause, ended_messages, failure_cause, holding, restarts
from trainkit.backends.eks.kube import (
    GROUP,
    PLURAL,
    TIMEOUT_S,
    VERSION,
    Kube,
    api_errors,
    stream_lines,
    unless_missing,
)
from trainkit.errors import SpecError
from trainkit.infra import outputs
from trainkit.job.build import Machine
from trainkit.job.tracking import stack_tracking
from trainkit.run.code import read_code
from trainkit.run.secrets import Credential
from trainkit.run.state import RunStatus, early_in, finished_said, pytorchjob_state
from trainkit.run.storage import fsx_mb_s
from trainkit.run.torchrun import GROUP_RANK, rank_prefix, rendezvous_id
from trainkit.run.workload import Workload


def resolve(job: Job) -> Machine:
    """Defaults from the cluster's infra outputs; one process per GPU of the instance type."""
    infra = outputs.load_outputs()
    placement, elastic = job.placement, job.elastic
    if placement.instance_type is None:
        placement.instance_type = infra.instance_type
        if not infra.recorded:
            job.run.notes.append(
                f"no infra outputs recorded yet (`make up PROFILE=aws` records them): assuming "
                f"{placement.instance_type} nodes; --instance-type sets it"
            )
    machine = cloud_machine(job, infra.default_image)
    stack_tracking(job, infra)
    if placement.namespace is None:
        placement.namespace = cluster.JOBS_NAMESPACE
    if elastic.rdzv is None:
        elastic.rdzv = "etcd"
        job.run.notes.append(
            "rendezvous: etcd (the platform's), which survives the loss of any node; "
            "--rdzv c10d uses a store on worker 0 instead (docs/elastic.md)"
        )
    if elastic.rdzv == "etcd" and not elastic.rdzv_endpoint:
        elastic.rdzv_endpoint = cluster.etcd_endpoint()
    return machine


def code_of(job: Job, workload: Workload) -> dict[str, bytes] | None:
    """The user's code the workload brings (a script's folder), for its ConfigMap; None when it brings none."""
    return read_code(Path(workload.code), job.run.runs_dir) if workload.code is not None else None


def manifest_yaml(job: Job, workload: Workload, rdzv_id: str | None = None) -> str:
    """The objects a submission creates, in order: NetworkPolicy, the code's ConfigMap if any, the PyTorchJob (one
    YAML document each)."""
    parts, manifest = submission.job_objects(
        job, workload, rdzv_id or rendezvous_id(job), code_of(job, workload), submission.token(), None
    )
    return yaml.safe_dump_all([*parts, manifest], sort_keys=False, width=120)


def check_workload(workload: Workload) -> None:
    """What a workload asks of the cluster that only this target can refuse, before anything is created."""
    if workload.wheelhouse is not None and not rules.on_fsx(workload.wheelhouse):
        raise SpecError(
            f"--wheelhouse {workload.wheelhouse}: the pods install from the FSx volume and this path leaves it; "
            f"copy the wheels there and give a path under {cluster.FSX_MOUNT} (or relative to it)"
        )


def submit(
    job: Job, workload: Workload, kube: Kube | None = None, ecr=None, rdzv_id: str | None = None, eks=None
) -> str:
    """Check, then wake, then create: the GPU node group is asked for the job's nodes only once nothing
    refuses the job, and back when creating it fails (no node stays up without a job); the preflight counts the
    nodes it will have."""
    check_workload(workload)
    code = code_of(job, workload)
    kube = kube or Kube.connect()
    p = job.parallelism  # without recorded outputs there is no plan and nothing is scaled
    preflight.check_cluster(kube)  # the plan reads what holds and waits for GPU nodes
    plan = nodegroup.plan_wake(outputs.load_outputs(), job.placement.instance_type, p.min_nodes, p.nodes, kube, eks)
    notes = preflight.preflight(kube, job, ecr, job.run.workload == "recipe", plan.desired if plan else None)
    with nodegroup.woken(plan) as woke:  # a job not created scales the group back
        for note in [woke, *notes]:
            if note:
                print(f"note: {note}", flush=True)
        parts, manifest = submission.job_objects(
            job, workload, rdzv_id or rendezvous_id(job), code, submission.token(), secrets.token_hex(32)
        )
        namespace = job.placement.namespace
        submission.create_job(kube, job, parts, manifest)
    name = manifest["metadata"]["name"]
    runs = cluster.FSX_MOUNT + "/" + str(job.run_dir).lstrip("/")
    run_id, p = job.run.run_id, job.parallelism
    named = (
        f"\nonce it ends: {', '.join(str(job.run_dir / n) for n in workload.outputs)} on FSx"
        if workload.outputs
        else ""
    )
    return (
        f"submitted {namespace}/{name}: {p.nodes} x {job.placement.instance_type}, {p.nproc} processes each, "
        f"rendezvous {job.elastic.rdzv}; outputs in {runs} on FSx\n"
        f"follow it: invoke status --run-id {run_id} | invoke logs --run-id {run_id} -f{named}"
    )


# ---------------------------------------------------------------- following a job


def newest_job(kube: Kube, namespace: str, run_id: str | None) -> dict | None:
    """The job of `run_id`, or the newest trainkit job in the namespace; None when there is none."""
    selector = ",".join(f"{k}={v}" for k, v in render.MANAGED_BY.items())
    if run_id:
        selector += f",{render.LABEL_RUN}={render.label_value(run_id)}"
    jobs = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector=selector, _request_timeout=TIMEOUT_S
    )["items"]
    return max(jobs, key=lambda job: job["metadata"].get("creationTimestamp", "")) if jobs else None


def no_job(namespace: str, run_id: str | None) -> SpecError:
    which = f"for run {run_id}" if run_id else "from trainkit"
    return SpecError(f"no job {which} in namespace {namespace}: submit one with `invoke train --target eks`")


def find_job(kube: Kube, namespace: str, run_id: str | None) -> dict:
    """The job of `run_id`, or the newest trainkit job in the namespace."""
    job = newest_job(kube, namespace, run_id)
    if job is None:
        raise no_job(namespace, run_id)
    return job


def job_pods(kube: Kube, job: dict) -> list:
    name = job["metadata"]["name"]
    pods = kube.core.list_namespaced_pod(
        job["metadata"]["namespace"],
        label_selector=f"{render.LABEL_RUN}={job['metadata']['labels'][render.LABEL_RUN]}",
        _request_timeout=TIMEOUT_S,
    ).items
    return sorted((p for p in pods if p.metadata.name.startswith(f"{name}-")), key=lambda p: p.metadata.name)


def status(namespace: str, run_id: str | None, kube: Kube | None = None) -> RunStatus:
    """The job's conditions as training-operator v1.9.4 writes them (one per type; Running turns False when
    the job ends), its pods, and why a failed container ended (its termination message). The state is the
    newest condition that holds. Jobs restart by exit code (render.RESTART_BY_EXIT_CODE): a failed pod is
    replaced, or fails the job when its code says no restart helps. Under the OnFailure policy of jobs from
    earlier versions containers restart in place and the operator fails the job when their restart counts reach
    runPolicy.backoffLimit, so that sum is shown for them. With no trainkit job in the namespace (and no run id
    asked for) that is said, with what the GPU nodes up cost and the idle guard's last check: between runs
    those are what matter."""
    kube = kube or Kube.connect()
    job = newest_job(kube, namespace, run_id)
    if job is None and run_id:
        raise no_job(namespace, run_id)
    if job is None:
        idle = idle_guard.describe(kube, outputs.load_outputs())
        said = f"no trainkit job in namespace {namespace} (`invoke train --target eks` submits one)"
        return RunStatus(None, "\n".join([said, *idle]))
    meta = job["metadata"]
    conditions = job.get("status", {}).get("conditions", [])
    state = (holding(job) or ["Pending"])[-1]
    run_state = pytorchjob_state(holding(job))
    pods = job_pods(kube, job)
    said = finished_said(run_state, early_in(ended_messages(pods)))
    lines = [f"job {meta['namespace']}/{meta['name']} (run {meta['annotations'][render.LABEL_RUN]}): {said} ({state})"]
    for condition in conditions:
        when, message = condition.get("lastTransitionTime", ""), condition.get("message", "")
        lines.append(f"  {condition['type']:<11} {condition.get('status', '?'):<5} {when}  {message}".rstrip())
    lines.append(f"  {'pod':<40} {'phase':<10} {'restarts':>8}  node")
    for pod in pods:
        lines.append(
            f"  {pod.metadata.name:<40} {pod.status.phase or '?':<10} {restarts(pod):>8}  {pod.spec.node_name or '-'}"
        )
    if not pods:
        lines.append("  (no pods yet)" if state not in ("Succeeded", "Failed") else "  (no pods left)")
    cause = deadline_cause(job) or failure_cause(pods)
    if cause and state != "Succeeded":
        lines.append(f"  cause      {cause}")
    lines.extend(idle_guard.describe(kube, outputs.load_outputs()))
    limit = job["spec"].get("runPolicy", {}).get("backoffLimit")
    in_place = job["spec"]["pytorchReplicaSpecs"]["Worker"].get("restartPolicy") in ("OnFailure", "Always")
    if limit is not None and in_place and state not in ("Succeeded", "Failed"):
        counted = sum(restarts(pod) for pod in pods if pod.status.phase == "Running")
        lines.append(f"  restarts of running pods: {counted} of backoffLimit {limit} (the job fails at the limit)")
    return RunStatus(run_state, "\n".join(lines))


def pods_by_group_rank(kube: Kube, pods: list) -> dict:
    """{group rank: pod} from the latest rendezvous round each pod's agent logged (LOGLEVEL=INFO)."""
    by_node = {}
    for pod in pods:
        text = kube.core.read_namespaced_pod_log(
            pod.metadata.name, pod.metadata.namespace, container=render.CONTAINER, _request_timeout=TIMEOUT_S
        )
        ranks = GROUP_RANK.findall(text or "")
        if ranks:
            by_node[int(ranks[-1])] = pod
    return by_node


def logs(
    namespace: str, run_id: str | None, rank: int | None = None, follow: bool = False, kube: Kube | None = None
) -> Iterator[str]:
    """Lines of the leader's log (group rank 0), or of global `rank` only (torchrun prefixes each worker's lines)."""
    kube = kube or Kube.connect()
    job = find_job(kube, namespace, run_id)
    pods = job_pods(kube, job)
    if not pods:
        if {"Succeeded", "Failed"} & set(holding(job)):
            run = job["metadata"]["annotations"][render.LABEL_RUN]
            raise SpecError(
                f"job {job['metadata']['name']} has ended and its pods are gone (the operator deletes pods still "
                f"running at the end); every rank's log is on FSx under runs/{run}/logs/"
            )
        raise SpecError(f"job {job['metadata']['name']} has no pods yet: see `invoke status`")
    nproc = int(job["spec"]["nprocPerNode"])
    by_node = pods_by_group_rank(kube, pods)
    if rank is None:
        pod, prefix = by_node.get(0, pods[0]), ""
        if 0 not in by_node:  # the operator deletes the pods still running when the first one finishes
            run = job["metadata"]["annotations"][render.LABEL_RUN]
            yield (
                f"note: no pod of {job['metadata']['name']} holds group rank 0 now (at a job's end the operator "
                f"deletes pods still running); every rank's log stays on FSx under runs/{run}/logs/"
            )
    else:
        if rank // nproc not in by_node:
            known = f"0..{len(by_node) * nproc - 1}" if by_node else "none yet"
            raise SpecError(f"--rank {rank} is not running (ranks now: {known}); see `invoke status`")
        pod, prefix = by_node[rank // nproc], rank_prefix(rank, nproc)
    role = f" (rank {rank})" if rank is not None else (" (leader)" if 0 in by_node else "")
    yield f"==> {pod.metadata.name}{role}"
    response = kube.core.read_namespaced_pod_log(
        pod.metadata.name, namespace, container=render.CONTAINER, follow=follow, _preload_content=False
    )
    yield from (line for line in stream_lines(response) if line.startswith(prefix))


def stop(namespace: str, run_id: str | None, kube: Kube | None = None) -> str:
    kube = kube or Kube.connect()
    job = find_job(kube, namespace, run_id)
    meta = job["metadata"]
    unless_missing(  # already gone is as good as deleted
        kube.custom.delete_namespaced_custom_object,
        GROUP,
        VERSION,
        meta["namespace"],
        PLURAL,
        meta["name"],
        propagation_policy="Foreground",
    )
    run = meta["annotations"][render.LABEL_RUN]
    return (
        f"deleted job {meta['namespace']}/{meta['name']}; its pods stop (checkpoint at the step boundary when time "
        f"allows). Outputs stay on FSx; submit with --run-id {run} to resume."
    )


def put_secret(credential: Credential, token: str, namespace: str, kube: Kube | None = None) -> str:
    """Create (or replace) the Secret the pods read a credential from. The value goes only into the request body."""
    kube = kube or Kube.connect()
    preflight.check_cluster(kube)
    secret = render.render_secret(credential, token, namespace)
    api_error, _ = api_errors()
    try:
        kube.core.create_namespaced_secret(namespace, secret, _request_timeout=TIMEOUT_S)
        verb = "created"
    except api_error as error:
        if error.status != 409:
            raise
        kube.core.replace_namespaced_secret(credential.name, namespace, secret, _request_timeout=TIMEOUT_S)
        verb = "replaced"
    return f"{verb} Secret {namespace}/{credential.name}; training pods read it as {credential.env}"


class EksBackend(Backend):
    """A PyTorchJob of the Kubeflow training operator on the cluster `make up PROFILE=aws` made."""

    name = "eks"

    def resolve(self, job: Job) -> Machine:
        return resolve(job)

    def check(self, job: Job) -> None:
        rules.check(job)

    def storage_mb_s(self, job: Job) -> float | None:
        """The run folder is on the infra stack's FSx file system: its throughput per TiB x its size."""
        infra = outputs.load_outputs()
        return fsx_mb_s(infra.fsx_capacity_gib, infra.fsx_throughput_per_tib)

    def path_for(self, job: Job, path: str, flag: str) -> str:
        return rules.fsx_relative(path, flag)

    def submit(self, job: Job, workload: Workload, dry_run: bool = False) -> int:
        for note in job.run.notes:  # stderr: with --dry-run, stdout is only the YAML
            print(f"note: {note}", file=sys.stderr, flush=True)
        if not workload.distributed:
            task.submit_task(job, workload, dry_run)  # a followed Job that failed raises JobFailed
            return 0
        print(manifest_yaml(job, workload) if dry_run else submit(job, workload), flush=True)
        return 0

    def status(self, ref: RunRef) -> RunStatus:
        return status(_namespace(ref), ref.run_id)

    def logs(self, ref: RunRef, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        return logs(_namespace(ref), ref.run_id, rank, follow)

    def stop(self, ref: RunRef) -> str:
        return stop(_namespace(ref), ref.run_id)

    def export_location(self, run_id: str | None) -> str:
        run = run_id or "<run-id>"
        folder = f"{cluster.FSX_MOUNT}/runs/{run}"
        return (
            f"its export is {folder}/{EXPORT_DIR} on the cluster's FSx volume; copy the run here without its "
            f"checkpoints from a pod or machine that mounts it (e.g. `kubectl cp <pod>:{folder}/{EXPORT_DIR} "
            f"runs/{run}/{EXPORT_DIR}`, with its spec.json and summary.json), then run this again"
        )

    def put_secret(self, credential: Credential, token: str, ref: RunRef) -> str:
        return put_secret(credential, token, _namespace(ref))


def _namespace(ref: RunRef) -> str:
    return ref.namespace or cluster.JOBS_NAMESPACE
