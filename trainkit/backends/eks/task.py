"""A task on EKS: a one-process workload (`Workload.distributed` false: the S3 -> FSx data copy) as a batch/v1 Job.

The pod runs the workload's module in the training image, with the FSx volume as its working directory, on a CPU
node of the system pool (preferring the FSx file system's zone), and, when the workload reads S3, as the data
service account, to which EKS Pod Identity gives read access to the infra stack's `data_source_buckets` and
nothing else. Before anything is created: the buckets it reads are ones the job may read (when infra outputs are
recorded), the image in ECR, the volume bound, the service account there, and no other task writing the same
folder. A failed pod is replaced (the data copy resumes where it stopped); the module's exit 2 (what a retry
cannot mend) fails the Job at once. With `Workload.follow` the submit streams the pods' logs until the Job ends.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable

import yaml

from training.spec import Job
from trainkit.backends.eks import cluster, render
from trainkit.errors import JobFailed, SpecError
from trainkit.infra import outputs
from trainkit.run.workload import Workload

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # set on a Job's pods by the Job controller (Kubernetes >= 1.27)
POLL_S = 2.0
WAITING_REPORT_S = 60.0


def waiting_report(namespace: str, name: str, pods: list) -> str:
    """Why the Job has no running pod: each pending pod's waiting reason or scheduling message, or no pod at all."""
    if not pods:
        return (
            f"waiting: job {namespace}/{name} has no pod yet; `kubectl -n {namespace} describe job {name}` shows why "
            "(FailedCreate: a quota, the service account)"
        )
    reasons = []
    for pod in pods:
        if pod.status.phase != "Pending":
            continue
        waiting = [s.state.waiting for s in pod.status.container_statuses or [] if s.state and s.state.waiting]
        unscheduled = [c for c in pod.status.conditions or [] if c.type == "PodScheduled" and c.status == "False"]
        why = (
            f"{waiting[0].reason}: {waiting[0].message or ''}".rstrip(": ")
            if waiting
            else (unscheduled[0].message if unscheduled else "pending")
        )
        reasons.append(f"{pod.metadata.name} {why}")
    return "waiting: " + ("; ".join(reasons) or f"job {namespace}/{name} between pods (back-off before a retry)")


def check_bucket(source: str | None, infra: outputs.InfraOutputs, flag: str = "--source") -> str | None:
    """An s3:// source must be in a bucket the data role may read; a note when no infra outputs say which."""
    if not source:
        return None
    from training.vision.prep import PrepError, parse_s3_url

    try:
        bucket, _ = parse_s3_url(source, flag)
    except PrepError as error:
        raise SpecError(str(error)) from None
    if not infra.recorded:
        return f"no infra outputs recorded: not checked that the data job may read s3://{bucket}"
    if bucket not in infra.data_buckets:
        readable = ", ".join(infra.data_buckets) or "none"
        raise SpecError(
            f"the data job may read only the buckets in data_source_buckets ({readable}), not {bucket}: add "
            f'"{bucket}" to data_source_buckets in terraform/stacks/infra/terraform.tfvars and run '
            "`make up PROFILE=aws`"
        )
    return None


def dest_label(dest: str) -> str:
    return hashlib.sha256(dest.encode()).hexdigest()[:16]


def check_service_account(kube, namespace: str) -> None:
    """Without its service account the Job's pods are never created (the Job only records FailedCreate)."""
    from trainkit.backends.eks.kube import unless_missing

    if unless_missing(kube.core.read_namespaced_service_account, cluster.DATA_SERVICE_ACCOUNT, namespace) is None:
        raise SpecError(
            f"the cluster has no service account {namespace}/{cluster.DATA_SERVICE_ACCOUNT} for the data job: run "
            "`make up PROFILE=aws` (the platform stack creates it)"
        )


def check_no_writer(kube, namespace: str, dest: str) -> None:
    """Two copies into one folder would race on the same partial files: refuse while another is active."""
    from trainkit.backends.eks.kube import TIMEOUT_S

    selector = f"{render.LABEL_DATA_DEST}={dest_label(dest)}"
    for job in kube.batch.list_namespaced_job(namespace, label_selector=selector, _request_timeout=TIMEOUT_S).items:
        if not _ended(job):
            raise SpecError(
                f"data job {job.metadata.name} is still writing {cluster.FSX_MOUNT}/{dest}: wait for it to end "
                "(a new job resumes where an ended one stopped), or choose another --dest"
            )


def _ended(job) -> str | None:
    """'Complete' or 'Failed' once the Job controller says so (v1.31+ first adds SuccessCriteriaMet or
    FailureTarget while pods still terminate; the job has ended only with Complete or Failed)."""
    for condition in job.status.conditions or []:
        if condition.type in ("Complete", "Failed") and condition.status == "True":
            return condition.type
    return None


def submit_task(job: Job, workload: Workload, dry_run: bool, kube=None, ecr=None, out: Callable[[str], None] = print):
    """Create the Job (or print it, `dry_run`); with `workload.follow`, stream its pods' logs until it ends (a failed
    Job raises JobFailed)."""
    infra = outputs.load_outputs()
    namespace = job.placement.namespace
    if workload.reads and namespace != cluster.JOBS_NAMESPACE:
        raise SpecError(
            f"--namespace {namespace}: the data job runs in {cluster.JOBS_NAMESPACE}, where the platform stack made "
            f"its service account ({cluster.DATA_SERVICE_ACCOUNT}) and the infra stack its S3 access; leave it out"
        )
    writes = workload.writes or "."
    name = render.job_name(job.run.run_id)
    args = list(workload.args)
    manifest = render.render_prep_job(
        name,
        namespace,
        job.placement.image,
        args,
        dest_label(writes),
        infra.fsx_zone,
        f"{cluster.FSX_MOUNT}/{writes}",
        module=str(workload.module),
    )
    notes = [check_bucket(url, infra, flag) for flag, url in workload.reads.items()]
    if dry_run:
        _notes(notes)
        out(yaml.safe_dump(manifest, sort_keys=False, width=120))
        return
    from trainkit.backends.eks import image, preflight
    from trainkit.backends.eks.kube import TIMEOUT_S, Kube

    kube = kube or Kube.connect()
    preflight.check_cluster(kube)
    preflight.check_volume(kube, namespace)
    if workload.reads:
        check_service_account(kube, namespace)
    check_no_writer(kube, namespace, writes)
    notes.append(image.check_image_ref(job.placement.image, ecr)[0])
    _notes(notes)
    kube.batch.create_namespaced_job(namespace, manifest, _request_timeout=TIMEOUT_S)
    source = workload.reads.get("--source") or "(no source: re-lay out and check)"
    out(f"submitted {namespace}/{name}: {source} -> {cluster.FSX_MOUNT}/{writes}")
    if not workload.follow:
        out(f"follow it: kubectl -n {namespace} logs -f job/{name} (or submit with --follow)")
        return
    if follow_job(kube, namespace, name, out):
        raise JobFailed(1, f"job {namespace}/{name} failed: its log above says why; submitting again resumes it")


def _notes(notes: list[str | None]) -> None:
    for note in notes:
        if note:
            print(f"note: {note}", file=sys.stderr, flush=True)


def follow_job(kube, namespace: str, name: str, out: Callable[[str], None] = print, poll_s: float = POLL_S) -> int:
    """Each pod's log in turn (a failed pod's replacement after it) until the Job ends: 0 Complete, 1 Failed."""
    from trainkit.backends.eks.kube import TIMEOUT_S, stream_lines

    followed: set[str] = set()
    quiet_since = time.monotonic()
    while True:
        job = kube.batch.read_namespaced_job(name, namespace, _request_timeout=TIMEOUT_S)
        pods = kube.core.list_namespaced_pod(
            namespace, label_selector=f"{JOB_NAME_LABEL}={name}", _request_timeout=TIMEOUT_S
        ).items
        started = [p for p in pods if p.metadata.name not in followed and p.status.phase != "Pending"]
        if started:
            pod = min(started, key=lambda p: p.metadata.creation_timestamp or 0)
            followed.add(pod.metadata.name)
            out(f"==> {pod.metadata.name}")
            response = kube.core.read_namespaced_pod_log(
                pod.metadata.name, namespace, container=render.PREP_CONTAINER, follow=True, _preload_content=False
            )
            for line in stream_lines(response):
                out(line)
            quiet_since = time.monotonic()
            continue
        if time.monotonic() - quiet_since > WAITING_REPORT_S:  # say why nothing is running rather than hang silently
            out(waiting_report(namespace, name, pods))
            quiet_since = time.monotonic()
        ended = _ended(job)
        if ended:
            failed = next(c for c in job.status.conditions if c.type == ended)
            out(
                f"job {namespace}/{name}: {ended}"
                + (f" ({failed.reason}: {failed.message})" if ended == "Failed" else "")
            )
            return 0 if ended == "Complete" else 1
        time.sleep(poll_s)
