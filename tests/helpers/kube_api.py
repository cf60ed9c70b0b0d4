"""A local Kubernetes API server for the paths the EKS backend uses, with a small operator and kubelet.

Requests come from the official Kubernetes client over real HTTP. A created PyTorchJob is checked as
a cluster with training-operator v1.9.4 checks it (tests/helpers/crd.py: the CRD's schema, strictly, and
the validating webhook); its workers become pods whose container really runs here: the command, args,
working directory (the `/fsx` mount maps to a local folder) and environment from the manifest plus the
operator's PET_* variables, Secrets and the downward API resolved.

The operator's rules, from kubeflow/trainer at v1.9.4, for our shape (Worker replicas only, an
elasticPolicy, restartPolicy ExitCode, OnFailure or Never, cleanPodPolicy Running):
- kubelet: under restartPolicy OnFailure a container that exits non-zero restarts in place (restartCount + 1,
  the pod stays Running, the last run's end in lastState.terminated); one that exits 0 completes its pod
  (Succeeded). Under restartPolicy Never a non-zero exit fails the pod (Failed). The operator copies the
  replica's policy into the pod template, ExitCode as Never (pkg/core/pod.go SetRestartPolicy). `$(VAR)` in
  command and args is replaced by the container's variable VAR, `$$` by `$`, an unknown reference stays as
  written (Kubernetes v1.33 third_party/forked/golang/expansion/expand.go, as the kubelet applies it).
- termination messages (kubernetes.io/docs/tasks/debug/debug-application/determine-reason-pod-failure): the
  file at the container's terminationMessagePath, at most 4096 bytes, becomes state.terminated.message; under
  terminationMessagePolicy FallbackToLogsOnError an empty file and a non-zero exit give the log's last 80 lines,
  at most 2048 bytes. A real kubelet mounts a file of the pod's at that path; a process here cannot have its own
  /dev, so the file's local path reaches the container as TRAINKIT_TERMINATION_LOG (what the pod entry point
  reads first, trainkit/backends/eks/pod.py).
- ExitCode (pkg/controller.v1/common/pod.go ReconcilePods L338-370, pkg/util/train/train_util.go): a Failed pod
  whose container exited with 128 or more is deleted (created again on the next round) and the job gets a
  Restarting condition ("job <name> is restarting because Worker replica(s) failed."); one that exited with
  1-127 fails the job ('job "<name>" is failing because "Worker" replica(s) failed.').
- status (pkg/controller.v1/pytorch/pytorchjob_controller.go, UpdateJobStatus L343-447): an elastic job
  is Succeeded as soon as ANY Worker pod succeeded; else Running while a pod runs. Reasons
  PyTorchJobCreated/Running/Succeeded/Failed, messages as the operator writes them.
- backoff (pkg/core/job.go L95-133, PastBackoffLimit): Failed when the restart counts summed over the
  job's Running pods reach runPolicy.backoffLimit; no Restarting condition for in-place restarts (under
  ExitCode and Never containers never restart in place, so this count stays 0). And
  (pkg/controller.v1/common/job.go L176-200, exceedsBackoffLimit): a new failed pod while fewer pods than
  replicas are active fails the job when the work queue's retries + 1 exceed backoffLimit ("Job <name> has
  failed because it has reached the specified backoff limit") before UpdateJobStatus runs. The PyTorchJob
  controller's queue is util.FakeWorkQueue, whose NumRequeues is always 0
  (pkg/controller.v1/pytorch/pytorchjob_controller.go L82, pkg/common/util/fake_workqueue.go L56): so this
  fires only with backoffLimit 0, and pods replaced under ExitCode are replaced without bound.
- active deadline (runPolicy.activeDeadlineSeconds): PyTorchJobReconciler.UpdateJobStatus
  (pkg/controller.v1/pytorch/pytorchjob_controller.go) sets status.startTime at the job's first reconcile, whatever
  its pods do, and replaced pods do not reset it; JobController.ReconcileJobs (pkg/controller.v1/common/job.go),
  after the backoff checks and before anything else of the round, fails the job once core.PastActiveDeadline
  (pkg/core/job.go: now - startTime >= activeDeadlineSeconds) holds: completionTime, then Failed
  ("Job <name> has failed because it was active longer than specified deadline"), then the pods are deleted as
  at any finish (cleanPodPolicy Running: the Running and Pending ones). startTime goes through the API with
  whole seconds (RFC 3339), and so does the deadline's arithmetic here.
- failed pods (UpdateJobStatus L434-447): with failed pods and fewer succeeded plus running than replicas, a
  replica spec with restartPolicy Never fails the job ("... is failed because N Worker replica(s) failed.").
- finish (pkg/controller.v1/common/job.go L43-69, cleanPodPolicy Running): the pods still Running or
  Pending are deleted (SIGTERM, then SIGKILL after their grace period); finished pods stay.
- conditions (pkg/util/status.go L58-149): one per type, a changed one moved to the end; Running and
  Restarting replace each other; Succeeded/Failed set Running's status to False; after Failed nothing
  changes.

Network (Kubernetes' cluster networking and DNS concepts pages): each pod runs in a network and UTS namespace of its
own (tests/helpers/netns.py), with its own IP and its name as hostname (the kubelet's /etc/hosts names it), and
the operator's per-replica Service names (`<job>-worker-<i>`) resolve to the worker pods' IPs on every pod of the
job; nothing else resolves. What runs on the test's 127.0.0.1 (etcd) is reached at `FakeCluster.reach`.

Pods and PyTorchJobs are also listed across namespaces (GET /api/v1/pods, /apis/kubeflow.org/v1/pytorchjobs); a
pod bound to a node has the condition PodScheduled True, as the API server's binding sets it.

ConfigMaps (a user script's code): created as the API server validates them (the v1.33 schema, strictly, and data
plus binaryData at most 1 MiB); a pod that mounts one that does not exist yet stays Pending until it does, then
sees its items as files; deleting a PyTorchJob deletes the ConfigMaps it owns (the garbage collector).

batch/v1 Jobs (the data-preparation job), as Kubernetes v1.33's Job controller treats one with the defaults we
use (one completion, restartPolicy Never; pkg/controller/job/job_controller.go and the Jobs concept page): the
object is checked against the v1.33 OpenAPI schema (kubernetes-validate, strict: stricter than the API server's
default, which drops unknown fields with a warning); one pod named `<job>-<5 characters>` with the labels
batch.kubernetes.io/job-name, job-name, batch.kubernetes.io/controller-uid and controller-uid; a failed pod is
replaced after 10 s x 2^(failures - 1) (capped at 6 min) until more than spec.backoffLimit pods failed, then the
conditions FailureTarget and Failed (reason BackoffLimitExceeded, "Job has reached the specified backoff
limit"); a failed pod whose container's exit code matches a podFailurePolicy rule with action FailJob ends the
Job at once (FailureTarget, Failed; reason PodFailurePolicy, "Container <c> for pod <ns>/<pod> failed with exit
code <n> matching FailJob rule at index <i>"); a succeeded pod gives SuccessCriteriaMet then Complete (v1.31+
adds the first, then the terminal one). ServiceAccounts: GET of the ones in `service_accounts`; a pod naming
another is refused at admission. A container's secretKeyRef is resolved as it starts: a required one that is
missing holds it in CreateContainerConfigError until the Secret exists.
status.active/succeeded/failed count the pods. Pods get what Pod Identity would inject only through `pod_env`.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from tests.helpers.admission import denial
from tests.helpers.crd import admission_errors
from tests.helpers.netns import Network
from tests.helpers.network_policy import Endpoint, enforce
from trainkit.backends.eks.cluster import ETCD_ISSUER, FSX_LAYOUT, JOBS_NAMESPACE, PLATFORM_NAMESPACE
from trainkit.backends.eks.etcd_issuer import STATUS_PASSED
from trainkit.backends.eks.etcd_tls import CertificateAuthority
from trainkit.backends.eks.pod import CODE_MOUNT_ENV, TERMINATION_LOG_ENV
from trainkit.backends.eks.render import CODE_MOUNT
from trainkit.run.mounts import STANDIN_FSTYPE_ENV, mount_here
from trainkit.run.torchrun import TLS_CA

JOBS = re.compile(r"^/apis/kubeflow\.org/v1/namespaces/([^/]+)/pytorchjobs(?:/([^/]+))?$")
ALL_JOBS, ALL_PODS = "/apis/kubeflow.org/v1/pytorchjobs", "/api/v1/pods"  # the lists across namespaces
BATCH_JOBS = re.compile(r"^/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?$")
BACKOFF_BASE_S, BACKOFF_CAP_S = 10.0, 360.0
TERMINATION_MESSAGE_BYTES, FALLBACK_LINES, FALLBACK_BYTES = 4096, 80, 2048
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)(/log)?)?$")
SECRETS = re.compile(r"^/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?$")
ACCOUNTS = re.compile(r"^/api/v1/namespaces/([^/]+)/serviceaccounts/([^/]+)$")
CLAIMS = re.compile(r"^/api/v1/namespaces/([^/]+)/persistentvolumeclaims/([^/]+)$")
CONFIGMAPS = re.compile(r"^/api/v1/namespaces/([^/]+)/configmaps(?:/([^/]+))?$")
NETWORK_POLICIES = re.compile(r"^/apis/networking\.k8s\.io/v1/namespaces/([^/]+)/networkpolicies(?:/([^/]+))?$")
CONFIGMAP_BYTES = 1024 * 1024  # pkg/apis/core/validation ValidateConfigMap: data + binaryData, core.MaxSecretSize


VERSION = {  # every field of version.Info (the client requires them all)
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2025-04-23T00:00:00Z",
    "goVersion": "go1.24.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def matches(labels: dict, selector: str | None) -> bool:
    pairs = [item.split("=", 1) for item in (selector or "").split(",") if item]
    return all(labels.get(key) == value for key, value in pairs)


def status_body(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(word: str, env: dict) -> str:
    """The kubelet's expansion of `$(VAR)` references in a container's command and args."""
    return REFERENCE.sub(lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), word)


@dataclass
class Pod:
    manifest: dict
    log: Path
    env: dict
    cwd: Path
    process: subprocess.Popen | None = None
    restarts: int = 0
    phase: str = "Pending"
    termination_log: Path | None = None
    started_at: str = ""
    terminated: dict | None = None  # this container run's end: exitCode, reason, message, startedAt, finishedAt
    created_at: str = field(default_factory=now)
    last_terminated: dict | None = None  # the run before an in-place restart
    on: Callable[[list[str]], list[str]] | None = None  # how a command runs on the pod's own host (its network)
    waiting: str = ""  # why the kubelet holds a container it has not started (CreateContainerConfigError)

    @property
    def name(self) -> str:
        return self.manifest["metadata"]["name"]

    def declared(self) -> dict:
        """What `$(VAR)` may name: the container's own env and the operator's PET_* additions, not the node's."""
        names = {item["name"] for item in self.manifest["spec"]["containers"][0].get("env", [])}
        return {k: v for k, v in self.env.items() if k in names or k.startswith("PET_")}

    def start(self) -> None:
        container = self.manifest["spec"]["containers"][0]
        for init in self.manifest["spec"].get("initContainers", []):  # each to its end, first; FSx is `cwd` here
            words = [str(self.cwd) + word[len("/fsx") :] if word.startswith("/fsx/") else word for word in init["args"]]
            done = subprocess.run(init["command"] + words, cwd=self.cwd, env=self.env, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{self.name}: init container {init['name']} failed: {done.stdout}{done.stderr}")
        if self.termination_log is not None:
            self.termination_log.write_bytes(b"")  # each container run gets a new, empty file
        self.started_at, self.terminated = now(), None
        command = [expand(word, self.declared()) for word in container["command"] + container.get("args", [])]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.on(command) if self.on else command,
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.phase, self.waiting = "Running", ""

    def ended(self, code: int) -> None:
        """The kubelet records the container's end: exit code, reason and termination message."""
        container = self.manifest["spec"]["containers"][0]
        message = self.termination_log.read_bytes()[:TERMINATION_MESSAGE_BYTES] if self.termination_log else b""
        if not message and code and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            tail = self.log.read_bytes().splitlines(keepends=True)[-FALLBACK_LINES:] if self.log.exists() else []
            message = b"".join(tail)[-FALLBACK_BYTES:]
        self.terminated = {
            "exitCode": code if code >= 0 else 128 - code,  # a signal's death, as the runtime reports it
            "reason": "Completed" if code == 0 else "Error",
            "message": message.decode(errors="replace"),
            "startedAt": self.started_at,
            "finishedAt": now(),
            "containerID": "",
        }

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass

    def to_api(self) -> dict:
        body = json.loads(json.dumps(self.manifest))
        state = {"terminated": self.terminated} if self.terminated else {"running": {"startedAt": self.started_at}}
        if self.waiting and self.process is None:
            state = {"waiting": {"reason": self.waiting}}
        status = {
            "name": "pytorch",
            "restartCount": self.restarts,
            "ready": self.phase == "Running",
            "image": "x",
            "imageID": "",
            "containerID": "",
            "state": state,
        }
        if self.last_terminated:
            status["lastState"] = {"terminated": self.last_terminated}
        body["status"] = {"phase": self.phase, "containerStatuses": [status]}
        # Bound to a node at creation, as if the scheduler had found one: the API server's binding
        # (pkg/registry/core/pod/storage/storage.go, BindingREST) sets PodScheduled True as it sets nodeName.
        if body["spec"].get("nodeName"):
            scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": self.created_at}
            body["status"]["conditions"] = [scheduled]
        return body


def set_condition(conditions: list[dict], kind: str, reason: str, message: str) -> None:
    """pkg/util/status.go's updateJobConditions/setCondition for a condition with status True."""
    if any(c["type"] == "Failed" and c["status"] == "True" for c in conditions):
        return
    current = next((c for c in conditions if c["type"] == kind), None)
    if current and current["status"] == "True" and current["reason"] == reason:
        return
    stamp = now()
    kept = current["lastTransitionTime"] if current and current["status"] == "True" else stamp
    replaced = {"Running": "Restarting", "Restarting": "Running"}.get(kind)
    remaining = [c for c in conditions if c["type"] not in (kind, replaced)]
    if kind in ("Succeeded", "Failed"):
        for condition in remaining:
            if condition["type"] == "Running":
                condition["status"] = "False"
    condition = {"type": kind, "status": "True", "reason": reason, "message": message}
    conditions[:] = [*remaining, condition | {"lastUpdateTime": stamp, "lastTransitionTime": kept}]


def past_active_deadline(job: dict) -> bool:
    """pkg/core/job.go PastActiveDeadline: a deadline and a start time, and at least the deadline since the start."""
    limit = job["spec"].get("runPolicy", {}).get("activeDeadlineSeconds")
    start = job["status"].get("startTime")
    if limit is None or start is None:
        return False
    started = datetime.strptime(start, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return (datetime.now(UTC) - started).total_seconds() >= limit


def finished(job: dict) -> bool:
    return any(c["type"] in ("Succeeded", "Failed") and c["status"] == "True" for c in job["status"]["conditions"])


def operator_env(job: dict, index: int) -> dict:
    """The PET_* variables the operator adds to every container of an elastic job (envvar.go, elastic.go)."""
    spec, name = job["spec"], job["metadata"]["name"]
    policy = spec["elasticPolicy"]
    env = {
        "PYTHONUNBUFFERED": "1",
        "PET_NPROC_PER_NODE": str(spec.get("nprocPerNode", "auto")),
        "PET_RDZV_ENDPOINT": f"{policy.get('rdzvHost', f'{name}-worker-0')}:{policy.get('rdzvPort', 23456)}",
        "PET_RDZV_BACKEND": policy.get("rdzvBackend", "c10d"),
        "PET_NNODES": f"{policy['minReplicas']}:{policy['maxReplicas']}",
    }
    if "maxRestarts" in policy:
        env["PET_MAX_RESTARTS"] = str(policy["maxRestarts"])
    if "rdzvId" in policy:
        env["PET_RDZV_ID"] = policy["rdzvId"]
    return env


def issuer_status() -> dict:
    """The etcd issuer's status ConfigMap as a pass writes it (what the launcher's preflight reads), a new CA's."""
    data = {TLS_CA: CertificateAuthority.create().cert.decode(), STATUS_PASSED: now()}
    metadata = {
        "name": ETCD_ISSUER,
        "namespace": JOBS_NAMESPACE,
        "labels": {"app.kubernetes.io/managed-by": "trainkit"},
    }
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def layout_done() -> dict:
    """The platform's FSx layout Job once it completed (batch/v1 status conditions, as the Job controller sets them)."""
    done = now()
    conditions = [
        {"type": kind, "status": "True", "lastProbeTime": done, "lastTransitionTime": done}
        for kind in ("SuccessCriteriaMet", "Complete")
    ]
    metadata = {
        "name": FSX_LAYOUT,
        "namespace": PLATFORM_NAMESPACE,
        "uid": f"uid-{FSX_LAYOUT}",
        "creationTimestamp": done,
    }
    status = {"succeeded": 1, "startTime": done, "completionTime": done, "conditions": conditions}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": {"template": {}}, "status": status}


@dataclass
class FakeCluster:
    """State of the fake cluster; `root` holds the FSx folder and pod logs. `pod_env`: extra variables for
    every pod's container (a test's fault injection)."""

    root: Path
    operator_installed: bool = True
    pod_env: dict = field(default_factory=dict)
    claim_phase: str | None = "Bound"
    nodes: list[dict] = field(default_factory=list)
    secrets: dict = field(default_factory=dict)
    secret_metadata: dict = field(default_factory=dict)  # (namespace, name) -> ownerReferences and the like
    configmaps: dict = field(default_factory=dict)
    network_policies: dict = field(default_factory=dict)
    admission: list = field(default_factory=list)  # ValidatingAdmissionPolicies and their bindings, applied to pods
    refused_pods: list = field(default_factory=list)  # (namespace, name, message): what admission refused
    jobs: dict = field(default_factory=dict)
    batch_jobs: dict = field(default_factory=dict)
    pods: dict = field(default_factory=dict)
    deleted: list = field(default_factory=list)
    service_accounts: set = field(default_factory=lambda: {("trainkit-jobs", "trainkit-data")})
    service_names: dict = field(default_factory=dict)  # name -> address every pod resolves (`serve`)

    def __post_init__(self):
        self.fsx = self.root / "fsx"
        self.fsx.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.network = Network()  # the pods' network (tests/helpers/netns.py), open while the cluster is
        self.stopping = threading.Event()
        self._failures: dict = {}  # (namespace, job) -> failed pods in the replica status (the last round's)
        # a platform whose etcd issuer runs: its status ConfigMap as its last pass wrote it (a test that meets the
        # platform's etcd runs the issuer itself: tests/helpers/platform_etcd.py)
        self.configmaps[(JOBS_NAMESPACE, ETCD_ISSUER)] = issuer_status()
        # and whose FSx layout step gave the volume's root to the jobs' user (what every job's preflight reads)
        self.batch_jobs[(PLATFORM_NAMESPACE, FSX_LAYOUT)] = layout_done()
        self._filtered = False  # some pod's packet filter holds NetworkPolicy rules

    # ------------------------------------------------------------ lifecycle

    def add_nodes(self, instance_type: str, count: int, gpus: int, efa: int) -> None:
        for _ in range(count):
            self.nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": f"ip-10-0-0-{len(self.nodes) + 1}.ec2.internal",
                        "labels": {"node.kubernetes.io/instance-type": instance_type, "trainkit/pool": "gpu"},
                    },
                    "spec": {},
                    "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "vpc.amazonaws.com/efa": str(efa)}},
                }
            )

    def kubeconfig(self) -> Path:
        host, port = self.server.server_address
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://{host}:{port}"}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        path = self.root / "kubeconfig"
        path.write_text(json.dumps(config))
        return path

    def __enter__(self) -> FakeCluster:
        self.network.__enter__()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        threading.Thread(target=self._kubelet, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        with self.lock:
            for pod in self.pods.values():
                pod.kill()
        self.server.shutdown()
        self.network.close()

    def reach(self, endpoint: str) -> str:
        """host:port of a service this test runs on 127.0.0.1 (etcd), as the pods reach it: the network's gateway."""
        return self.network.reached(endpoint)

    # ------------------------------------------------------------ operator and kubelet

    def create_job(self, namespace: str, body: dict) -> tuple[int, dict]:
        if refused := admission_errors(body):
            code, message = refused
            return code, status_body(code, "Invalid" if code == 422 else "BadRequest", message)
        name = body["metadata"]["name"]
        with self.lock:
            if (namespace, name) in self.jobs:
                return 409, status_body(409, "AlreadyExists", f'pytorchjobs.kubeflow.org "{name}" already exists')
            # a new object's uid is new, as the API server makes it (a job submitted again under its name gets another)
            body["metadata"].update(creationTimestamp=now(), uid=f"uid-{name}-{uuid.uuid4().hex[:8]}")
            body["status"] = {"conditions": []}
            created = f"PyTorchJob {name} is created."
            set_condition(body["status"]["conditions"], "Created", "PyTorchJobCreated", created)
            self.jobs[(namespace, name)] = body
            worker = body["spec"]["pytorchReplicaSpecs"]["Worker"]
            self._services(name, worker["replicas"])
            for index in range(worker["replicas"]):
                self._create_pod(namespace, body, worker["template"], index)
        return 201, body

    def _services(self, job: str, replicas: int) -> None:
        """The operator's headless Service per replica, `<job>-worker-<i>`, selecting the pod of that name
        (training-operator v1.9.4, pkg/controller.v1/common/service.go): each worker pod's host is made now, the
        pod's IP kept across its replacements (a new pod may get another IP in a cluster; keeping it is one of the
        outcomes), and every service name resolves on every pod of the job, as cluster DNS resolves it."""
        names = [f"{job}-worker-{i}" for i in range(replicas)]
        hosts = [self.network.add(name, hostname=name) for name in names]  # kubelet: the hostname is the pod's name
        for host in hosts:
            peers = {other.hostname: other.address for other in hosts if other is not host}
            self.network.write_hosts(host, {**peers, **self.service_names})

    def serve(self, names: list[str], port: int, target: int) -> None:
        """A platform Service whose pods run on this machine (the test's etcd): `names` resolve on every pod to the
        network's gateway, whose `port` is relayed to 127.0.0.1:`target`, as cluster DNS and kube-proxy would."""
        self.network.relay(port, target)
        self.service_names.update({name: self.network.gateway for name in names})

    def _create_pod(self, namespace: str, job: dict, template: dict, index: int) -> None:
        name = f"{job['metadata']['name']}-worker-{index}"
        manifest = json.loads(json.dumps(template))
        manifest["metadata"].update(name=name, namespace=namespace)
        manifest["metadata"]["labels"].update(
            {
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/job-name": job["metadata"]["name"],
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": str(index),
            }
        )
        if index == 0:
            manifest["metadata"]["labels"]["training.kubeflow.org/job-role"] = "master"
        policy = job["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"]
        manifest["spec"]["restartPolicy"] = "Never" if policy == "ExitCode" else policy  # SetRestartPolicy
        manifest["spec"]["nodeName"] = self.nodes[index % len(self.nodes)]["metadata"]["name"] if self.nodes else None
        self._run_pod(namespace, manifest, operator_env(job, index))

    def _run_pod(self, namespace: str, manifest: dict, injected: dict | None = None) -> None:
        """The kubelet starting a pod: the container's env resolved (values, the pod's name, Secrets), what a
        controller injects, the test's `pod_env`; /fsx is the FSx folder. A pod whose ConfigMap volume does not
        exist yet stays Pending until it does (the kubelet retries the mount)."""
        name, container = manifest["metadata"]["name"], manifest["spec"]["containers"][0]
        # The ServiceAccount admission plugin refuses a pod whose account does not exist (plugin/pkg/admission/
        # serviceaccount/admission.go; `default` is in every namespace, its controller makes it).
        account = manifest["spec"].get("serviceAccountName") or "default"
        if account != "default" and (namespace, account) not in self.service_accounts:
            missing = f'serviceaccount "{account}" not found'
            refused = f'pods "{name}" is forbidden: error looking up service account {namespace}/{account}: {missing}'
            self.refused_pods.append((namespace, name, refused))
            return
        if refused := denial(self.admission, namespace, {**manifest, "metadata": {**manifest["metadata"]}}):
            self.refused_pods.append((namespace, name, refused))  # the creating controller gets the 422
            return
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(self.root)}
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
            elif "fieldRef" in item["valueFrom"]:
                env[item["name"]] = name  # metadata.name is the only field the manifests use
        env.update(injected or {})
        env.update(self.pod_env)
        cwd = self.fsx if container.get("workingDir") == "/fsx" else self.root
        termination_log = self.root / f"{name}.termination-log"
        env[TERMINATION_LOG_ENV] = str(termination_log)  # the kubelet's mount at terminationMessagePath
        env[STANDIN_FSTYPE_ENV] = mount_here(self.fsx).fstype  # the FSx folder stands for FSx for Lustre
        host = self.network.add(name, hostname=name)  # its own network namespace, its IP, its name as hostname
        on = functools.partial(self.network.command, host)
        log = self.root / f"{name}.log"
        pod = Pod(manifest, log, self.network.reach(env), cwd, termination_log=termination_log, on=on)
        self.pods[(namespace, name)] = pod
        self._enforce()  # before it starts: its filter, and the others' that may name it
        self._start_when_mounted(namespace, pod)

    def _start_when_mounted(self, namespace: str, pod: Pod) -> None:
        """Start the pod once every ConfigMap it mounts exists: the files (its items, or every key) under a folder
        of the pod's; a process here cannot have its own mounts, so the one at CODE_MOUNT reaches the container as
        CODE_MOUNT_ENV (what the pod entry point reads first, trainkit/backends/eks/pod.py)."""
        declared = pod.manifest["spec"].get("volumes", [])
        volumes = {v["name"]: v["configMap"] for v in declared if "configMap" in v}
        secrets = {v["name"]: v["secret"] for v in declared if "secret" in v}
        empty = {v["name"] for v in declared if "emptyDir" in v}
        if any((namespace, source["name"]) not in self.configmaps for source in volumes.values()):
            return
        if any((namespace, source["secretName"]) not in self.secrets for source in secrets.values()):
            return
        # Each secretKeyRef resolved as the kubelet starts the container (kubelet_pods.go makeEnvironmentVariables):
        # a missing Secret or key leaves an optional variable unset, and holds the container otherwise
        # (CreateContainerConfigError, retried) until it exists.
        for item in pod.manifest["spec"]["containers"][0].get("env", []):
            if ref := item.get("valueFrom", {}).get("secretKeyRef"):
                value = self.secrets.get((namespace, ref["name"]), {}).get(ref["key"])
                if value is None and not ref.get("optional"):
                    pod.waiting = "CreateContainerConfigError"
                    return
                if value is not None:
                    pod.env[item["name"]] = value
        for mount in pod.manifest["spec"]["containers"][0].get("volumeMounts", []):
            if mount["name"] in empty:  # a folder of the pod's; an env value naming the mount path names it
                folder = self.root / "volumes" / pod.name / mount["name"]
                folder.mkdir(parents=True, exist_ok=True)
                pod.env.update({k: str(folder) for k, v in pod.env.items() if v == mount["mountPath"]})
            if mount["name"] in secrets:  # every key a file; an env value naming the mount path now names the folder
                folder = self.root / "volumes" / pod.name / mount["name"]
                folder.mkdir(parents=True, exist_ok=True)
                for key, value in self.secrets[(namespace, secrets[mount["name"]]["secretName"])].items():
                    (folder / key).write_text(value)
                    (folder / key).chmod(secrets[mount["name"]].get("defaultMode", 0o644))
                pod.env.update({k: str(folder) for k, v in pod.env.items() if v == mount["mountPath"]})
            source = volumes.get(mount["name"])
            if source is None:
                continue
            body = self.configmaps[(namespace, source["name"])]
            files = {key: value.encode() for key, value in body.get("data", {}).items()}
            files.update({key: base64.b64decode(value) for key, value in body.get("binaryData", {}).items()})
            folder = self.root / "volumes" / pod.name / mount["name"]
            for item in source.get("items") or [{"key": key, "path": key} for key in files]:
                (folder / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                (folder / item["path"]).write_bytes(files[item["key"]])
            if mount["mountPath"] == CODE_MOUNT:
                pod.env[CODE_MOUNT_ENV] = str(folder)
        pod.start()

    def create_configmap(self, namespace: str, body: dict) -> tuple[int, dict]:
        """Checked against the v1.33 schema (strict) and the API server's size rule."""
        import kubernetes_validate

        from tests.helpers.kubernetes import kubernetes_version

        name = body["metadata"]["name"]
        try:
            kubernetes_validate.validate(body, kubernetes_version(), strict=True)
        except kubernetes_validate.ValidationError as error:
            return 422, status_body(422, "Invalid", f"ConfigMap is invalid: {error}")
        size = sum(len(v.encode()) for v in body.get("data", {}).values())
        size += sum(len(base64.b64decode(v)) for v in body.get("binaryData", {}).values())
        if size > CONFIGMAP_BYTES:
            message = f'ConfigMap "{name}" is invalid: []: Too long: must have at most {CONFIGMAP_BYTES} bytes'
            return 422, status_body(422, "Invalid", message)
        with self.lock:
            if (namespace, name) in self.configmaps:
                return 409, status_body(409, "AlreadyExists", f'configmaps "{name}" already exists')
            body["metadata"].update(namespace=namespace, uid=f"uid-{name}", creationTimestamp=now())
            self.configmaps[(namespace, name)] = body
        return 201, body

    def create_network_policy(self, namespace: str, body: dict) -> tuple[int, dict]:
        """Checked against the v1.33 schema (strict); enforced on every pod at once (network_policy.py)."""
        import kubernetes_validate

        from tests.helpers.kubernetes import kubernetes_version

        name = body["metadata"]["name"]
        try:
            kubernetes_validate.validate(body, kubernetes_version(), strict=True)
        except kubernetes_validate.ValidationError as error:
            return 422, status_body(422, "Invalid", f"NetworkPolicy is invalid: {error}")
        with self.lock:
            if (namespace, name) in self.network_policies:
                message = f'networkpolicies.networking.k8s.io "{name}" already exists'
                return 409, status_body(409, "AlreadyExists", message)
            body["metadata"].update(namespace=namespace, uid=f"uid-{name}", creationTimestamp=now())
            self.network_policies[(namespace, name)] = body
            self._enforce()
        return 201, body

    def _enforce(self) -> None:
        """Every pod's packet filter from the NetworkPolicies as they are now (none: nothing is filtered)."""
        with self.lock:
            if not self.network_policies and not self._filtered:
                return
            endpoints = []
            for (namespace, name), pod in self.pods.items():
                host = self.network.hosts.get(name)
                if host is None:
                    continue
                ports = {
                    port["name"]: (port["containerPort"], port.get("protocol", "TCP"))
                    for container in pod.manifest["spec"]["containers"]
                    for port in container.get("ports", [])
                    if "name" in port
                }
                labels = pod.manifest["metadata"].get("labels") or {}
                endpoints.append(Endpoint(namespace, labels, host.address, host.netns, ports))
            enforce(list(self.network_policies.values()), endpoints)
            self._filtered = bool(self.network_policies)

    def _kubelet(self) -> None:
        while not self.stopping.wait(0.2):
            with self.lock:
                for (namespace, _), pod in list(self.pods.items()):
                    if pod.phase == "Pending" and pod.process is None:
                        self._start_when_mounted(namespace, pod)
                for (namespace, name), job in self.jobs.items():
                    self._sync(namespace, name, job)
                for (namespace, name), job in self.batch_jobs.items():
                    self._sync_batch(namespace, name, job)

    # ------------------------------------------------------------ batch/v1 Jobs

    def create_batch_job(self, namespace: str, body: dict) -> tuple[int, dict]:
        import kubernetes_validate

        from tests.helpers.kubernetes import kubernetes_version

        try:
            kubernetes_validate.validate(body, kubernetes_version(), strict=True)
        except kubernetes_validate.ValidationError as error:
            return 422, status_body(422, "Invalid", f"Job.batch is invalid: {error}")
        name = body["metadata"]["name"]
        with self.lock:
            if (namespace, name) in self.batch_jobs:
                return 409, status_body(409, "AlreadyExists", f'jobs.batch "{name}" already exists')
            body["metadata"].update(namespace=namespace, creationTimestamp=now(), uid=f"uid-{name}")
            body["status"] = {"active": 0, "startTime": now()}
            body["_next_pod_at"] = 0.0  # the controller's own bookkeeping, not served
            self.batch_jobs[(namespace, name)] = body
            self._sync_batch(namespace, name, body)
        return 201, {k: v for k, v in body.items() if not k.startswith("_")}

    def _batch_pods(self, namespace: str, name: str) -> list[Pod]:
        return [
            p
            for (ns, _), p in self.pods.items()
            if ns == namespace and p.manifest["metadata"]["labels"].get("batch.kubernetes.io/job-name") == name
        ]

    def _create_batch_pod(self, namespace: str, job: dict) -> None:
        name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        manifest = json.loads(json.dumps(job["spec"]["template"]))
        suffix = "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
        manifest["metadata"].update(name=f"{name}-{suffix}", namespace=namespace, creationTimestamp=now())
        manifest["metadata"].setdefault("labels", {}).update(
            {
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "controller-uid": uid,
                "job-name": name,
            }
        )
        self._run_pod(namespace, manifest)

    def _sync_batch(self, namespace: str, name: str, job: dict) -> None:
        pods = self._batch_pods(namespace, name)
        for pod in pods:  # the kubelet, restartPolicy Never
            code = pod.process.poll() if pod.process else None
            if pod.phase == "Running" and code is not None:
                pod.phase = "Succeeded" if code == 0 else "Failed"
                if code:  # the controller's back-off before the replacement: 10 s, 20 s, 40 s ... (6 min at most)
                    failures = sum(p.phase == "Failed" for p in pods)
                    delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (failures - 1))
                    job["_next_pod_at"] = time.monotonic() + delay
        status = job["status"]
        if any(c["type"] in ("Complete", "Failed") for c in status.get("conditions", [])):
            return
        counts = {phase: sum(p.phase == phase for p in pods) for phase in ("Running", "Succeeded", "Failed")}
        status.update(active=counts["Running"], succeeded=counts["Succeeded"], failed=counts["Failed"])
        matched = self._fail_job_rule(job, pods)
        if matched:
            self._batch_end(status, ("FailureTarget", "Failed"), "PodFailurePolicy", matched)
        elif counts["Succeeded"]:
            self._batch_end(
                status,
                ("SuccessCriteriaMet", "Complete"),
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            )
        elif counts["Failed"] > job["spec"].get("backoffLimit", 6):
            self._batch_end(
                status,
                ("FailureTarget", "Failed"),
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            )
        elif not counts["Running"] and time.monotonic() >= job["_next_pod_at"]:
            self._create_batch_pod(namespace, job)
            status["active"] = 1

    @staticmethod
    def _fail_job_rule(job: dict, pods: list) -> str | None:
        """The message of the first failed pod whose exit code matches a FailJob rule (operator In only)."""
        rules = job["spec"].get("podFailurePolicy", {}).get("rules", [])
        for pod in pods:
            if pod.phase != "Failed":
                continue
            code = pod.process.returncode
            for index, rule in enumerate(rules):
                exit_codes = rule.get("onExitCodes", {})
                if rule["action"] == "FailJob" and exit_codes.get("operator") == "In" and code in exit_codes["values"]:
                    container = pod.manifest["spec"]["containers"][0]["name"]
                    return (
                        f"Container {container} for pod {pod.manifest['metadata']['namespace']}/{pod.name} failed "
                        f"with exit code {code} matching FailJob rule at index {index}"
                    )
        return None

    @staticmethod
    def _batch_end(status: dict, kinds: tuple[str, str], reason: str, message: str) -> None:
        stamp = now()
        status["conditions"] = [
            {
                "type": kind,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastProbeTime": stamp,
                "lastTransitionTime": stamp,
            }
            for kind in kinds
        ]
        if kinds[1] == "Complete":
            status["completionTime"] = stamp

    def _sync(self, namespace: str, name: str, job: dict) -> None:
        pods = [p for (ns, n), p in self.pods.items() if ns == namespace and n.startswith(f"{name}-worker-")]
        for pod in pods:  # the kubelet
            code = pod.process.poll() if pod.process else None
            if code is None or pod.phase != "Running":
                continue
            pod.ended(code)
            if code == 0:
                pod.phase = "Succeeded"
            elif pod.manifest["spec"].get("restartPolicy") == "Never":
                pod.phase = "Failed"
            else:  # restartPolicy OnFailure: the container restarts in place
                pod.restarts += 1
                pod.last_terminated = pod.terminated
                pod.start()
        if finished(job):
            return
        conditions = job["status"]["conditions"]
        worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
        running = [pod for pod in pods if pod.phase == "Running"]
        succeeded = [pod for pod in pods if pod.phase == "Succeeded"]
        limit = job["spec"].get("runPolicy", {}).get("backoffLimit")
        restarts = sum(pod.restarts for pod in running)
        failed = [pod for pod in pods if pod.phase == "Failed"]
        # ReconcileJobs (common/job.go L176-200): a new failed pod while not all replicas are active, and the work
        # queue's retries (always 0: a FakeWorkQueue) + 1 past backoffLimit, fails the job before anything else.
        previous_retry = 0  # jc.WorkQueue.NumRequeues(jobKey) of a FakeWorkQueue
        new_failure = len(failed) > self._failures.get((namespace, name), 0) and len(running) != worker["replicas"]
        exceeds = limit is not None and new_failure and previous_retry + 1 > limit
        if exceeds or (limit is not None and (restarts > 0 if limit == 0 else restarts >= limit)):
            message = f"Job {name} has failed because it has reached the specified backoff limit"
            set_condition(conditions, "Failed", "PyTorchJobFailed", message)
        elif past_active_deadline(job):
            job["status"].setdefault("completionTime", now())
            message = f"Job {name} has failed because it was active longer than specified deadline"
            set_condition(conditions, "Failed", "PyTorchJobFailed", message)
        if not finished(job):  # ReconcilePods: a pod for every index that has none (one deleted last round)
            for index in range(worker["replicas"]):
                if (namespace, f"{name}-worker-{index}") not in self.pods:
                    self._create_pod(namespace, job, worker["template"], index)
        if not finished(job) and worker["restartPolicy"] == "ExitCode":
            self._exit_code_policy(namespace, name, conditions, failed)
        # The replica status counts this round's failed pods, also the ones just deleted (updateJobReplicaStatuses
        # runs on the pods ReconcilePods was given).
        self._failures[(namespace, name)] = len(failed)
        if not finished(job):  # UpdateJobStatus: the active deadline's clock starts at the first reconcile
            job["status"].setdefault("startTime", now())
        if finished(job):
            pass
        elif succeeded and job["spec"].get("elasticPolicy") is not None:
            message = f"PyTorchJob {namespace}/{name} successfully completed."
            set_condition(conditions, "Succeeded", "PyTorchJobSucceeded", message)
        elif running:
            set_condition(conditions, "Running", "PyTorchJobRunning", f"PyTorchJob {namespace}/{name} is running.")
        if failed and worker["replicas"] > len(succeeded) + len(running):
            if worker["restartPolicy"] == "Never":
                message = f"PyTorchJob {name} is failed because {len(failed)} Worker replica(s) failed."
                set_condition(conditions, "Failed", "PyTorchJobFailed", message)
            else:
                message = f"PyTorchJob {name} is restarting because {len(failed)} Worker replica(s) failed."
                set_condition(conditions, "Restarting", "PyTorchJobRestarting", message)
        if finished(job) and job["spec"].get("runPolicy", {}).get("cleanPodPolicy", "None") == "Running":
            for pod in [pod for pod in pods if pod.phase in ("Running", "Pending")]:
                self._delete_pod(namespace, pod)

    def _exit_code_policy(self, namespace: str, name: str, conditions: list, failed: list) -> None:
        """ReconcilePods under restartPolicy ExitCode: a failed pod with a retryable code (128 or more) is deleted, to
        be created again; one with a permanent code (1-127) fails the job."""
        for pod in failed:
            code = pod.terminated["exitCode"]
            if code >= 128:
                self.pods.pop((namespace, pod.name), None)
                self.deleted.append(pod.name)
                message = f"job {name} is restarting because Worker replica(s) failed."
                set_condition(conditions, "Restarting", "PyTorchJobRestarting", message)
            else:
                message = f'job "{name}" is failing because "Worker" replica(s) failed.'
                set_condition(conditions, "Failed", "PyTorchJobFailed", message)

    def _delete_pod(self, namespace: str, pod: Pod) -> None:
        """The kubelet's stop: SIGTERM, then SIGKILL after the grace period; the pod leaves the API at once."""
        self.pods.pop((namespace, pod.name), None)
        self.deleted.append(pod.name)
        self._enforce()
        pod.kill(signal.SIGTERM)
        grace = pod.manifest["spec"].get("terminationGracePeriodSeconds", 30)
        threading.Timer(grace, pod.kill).start()

    def delete_job(self, namespace: str, name: str) -> tuple[int, dict]:
        with self.lock:
            job = self.jobs.pop((namespace, name), None)
            if job is None:
                return 404, status_body(404, "NotFound", f'pytorchjobs.kubeflow.org "{name}" not found')
            for key in [k for k in self.pods if k[0] == namespace and k[1].startswith(f"{name}-worker-")]:
                self._delete_pod(namespace, self.pods[key])
            # The garbage collector: objects the job owned (metadata.ownerReferences) go with it.
            uid = job["metadata"]["uid"]
            for objects in (self.configmaps, self.network_policies):
                for key, body in list(objects.items()):
                    if any(ref.get("uid") == uid for ref in body["metadata"].get("ownerReferences", [])):
                        del objects[key]
            for key, metadata in list(self.secret_metadata.items()):
                if any(ref.get("uid") == uid for ref in metadata.get("ownerReferences", [])):
                    self.secrets.pop(key, None)
                    del self.secret_metadata[key]
            self._enforce()
        return 200, status_body(200, "Deleted", name) | {"status": "Success"}

    def served_pods(self) -> list[dict]:
        """Every pod as the API serves it."""
        return [pod.to_api() for pod in self.pods.values()]

    def pod_list(self, namespace: str | None, selector: str | None) -> dict:
        """GET of pods in a namespace, or in all of them (namespace None)."""
        with self.lock:
            items = [
                pod
                for pod in self.served_pods()
                if namespace in (None, pod["metadata"]["namespace"])
                and matches(pod["metadata"].get("labels") or {}, selector)
            ]
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}

    # ------------------------------------------------------------ test controls

    @contextlib.contextmanager
    def visiting_pod(self, namespace: str, name: str, labels: dict) -> Iterator[str]:
        """A plain pod (another team's job, a notebook) on a host of its own while the block runs, then gone
        (neither listed nor counted as deleted): yields its name, for `connects`."""
        manifest = {
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {
                "securityContext": {"runAsNonRoot": True, "runAsUser": 2000},  # what the jobs' namespace admits
                "containers": [{"name": "main", "image": "x", "command": ["sleep", "600"]}],
            },
        }
        with self.lock:
            self._run_pod(namespace, manifest)
            if (namespace, name) not in self.pods:
                raise AssertionError(f"the visiting pod was refused: {self.refused_pods[-1]}")
        try:
            yield name
        finally:
            with self.lock:
                self.pods.pop((namespace, name)).kill()
                self._enforce()

    def connects(self, source: str, target: str, port: int, timeout: float = 1.5) -> bool:
        """Whether pod `source` opens a TCP connection to pod `target`'s address on `port` within `timeout`."""
        host, address = self.network.hosts[source], self.network.hosts[target].address
        probe = f"import socket; socket.create_connection(({address!r}, {port}), timeout={timeout}).close()"
        done = subprocess.run(self.network.command(host, [sys.executable, "-c", probe]), capture_output=True)
        return done.returncode == 0

    @contextlib.contextmanager
    def serving(self, name: str, port: int) -> Iterator[None]:
        """A TCP listener on every address of pod `name`'s network, as any socket of its processes (a store, NCCL's
        bootstrap) would be, while the block runs."""
        serve = f"import socket, time; s = socket.create_server(('', {port})); print('up', flush=True); time.sleep(600)"
        argv = self.network.command(self.network.hosts[name], [sys.executable, "-c", serve])
        server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "up", f"no listener on {name}:{port}"
            yield
        finally:
            server.kill()
            server.wait()

    def pod(self, name: str, namespace: str = "trainkit-jobs") -> Pod:
        return self.pods[(namespace, name)]

    def wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if predicate():
                    return
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _handler(cluster: FakeCluster):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # as the API server speaks it (chunked log streams are HTTP/1.1)

        def log_message(self, *args):
            pass

        def _send(self, code: int, body) -> None:
            data = json.dumps(body).encode() if not isinstance(body, bytes) else body
            self.send_response(code)
            self.send_header("Content-Type", "application/json" if not isinstance(body, bytes) else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            path = url.path
            if path in ("/version", "/version/") and method == "GET":
                return self._send(200, VERSION)
            if path == "/apis/kubeflow.org/v1" and method == "GET":
                if not cluster.operator_installed:
                    return self._send(
                        404, status_body(404, "NotFound", "the server could not find the requested resource")
                    )
                resource = {
                    "name": "pytorchjobs",
                    "singularName": "pytorchjob",
                    "namespaced": True,
                    "kind": "PyTorchJob",
                    "verbs": ["create", "delete", "get", "list"],
                }
                return self._send(
                    200, {"kind": "APIResourceList", "groupVersion": "kubeflow.org/v1", "resources": [resource]}
                )
            if path == "/api/v1/nodes" and method == "GET":
                items = [n for n in cluster.nodes if matches(n["metadata"]["labels"], query.get("labelSelector"))]
                return self._send(200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": items})
            if m := CLAIMS.match(path):
                if cluster.claim_phase is None:
                    return self._send(404, status_body(404, "NotFound", f'persistentvolumeclaims "{m[2]}" not found'))
                return self._send(
                    200,
                    {
                        "kind": "PersistentVolumeClaim",
                        "apiVersion": "v1",
                        "metadata": {"name": m[2], "namespace": m[1]},
                        "spec": {"accessModes": ["ReadWriteMany"]},
                        "status": {"phase": cluster.claim_phase},
                    },
                )
            if m := JOBS.match(path):
                return self._jobs(method, m[1], m[2], query)
            if path == ALL_JOBS and method == "GET":
                with cluster.lock:
                    items = [
                        j
                        for j in cluster.jobs.values()
                        if matches(j["metadata"].get("labels", {}), query.get("labelSelector"))
                    ]
                return self._send(
                    200, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJobList", "items": items, "metadata": {}}
                )
            if path == ALL_PODS and method == "GET":
                return self._send(200, cluster.pod_list(None, query.get("labelSelector")))
            if (m := ACCOUNTS.match(path)) and method == "GET":
                if (m[1], m[2]) not in cluster.service_accounts:
                    return self._send(404, status_body(404, "NotFound", f'serviceaccounts "{m[2]}" not found'))
                return self._send(
                    200, {"kind": "ServiceAccount", "apiVersion": "v1", "metadata": {"name": m[2], "namespace": m[1]}}
                )
            if m := BATCH_JOBS.match(path):
                return self._batch_jobs(method, m[1], m[2], query)
            if m := PODS.match(path):
                return self._pods(method, m[1], m[2], bool(m[3]), query)
            if m := SECRETS.match(path):
                return self._secrets(method, m[1], m[2])
            if m := CONFIGMAPS.match(path):
                return self._configmaps(method, m[1], m[2])
            if m := NETWORK_POLICIES.match(path):
                return self._network_policies(method, m[1], m[2])
            return self._send(404, status_body(404, "NotFound", f"no route for {method} {path}"))

        def _jobs(self, method, namespace, name, query):
            if method == "POST" and name is None:
                return self._send(*cluster.create_job(namespace, self._body()))
            if method == "DELETE" and name:
                return self._send(*cluster.delete_job(namespace, name))
            with cluster.lock:
                if method == "GET" and name:
                    job = cluster.jobs.get((namespace, name))
                    if job is None:
                        return self._send(404, status_body(404, "NotFound", f'pytorchjobs "{name}" not found'))
                    return self._send(200, job)
                if method == "GET":
                    items = [
                        j
                        for (ns, _), j in cluster.jobs.items()
                        if ns == namespace and matches(j["metadata"].get("labels", {}), query.get("labelSelector"))
                    ]
                    return self._send(
                        200, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJobList", "items": items, "metadata": {}}
                    )
            return self._send(405, status_body(405, "MethodNotAllowed", method))

        def _batch_jobs(self, method, namespace, name, query):
            if method == "POST" and name is None:
                return self._send(*cluster.create_batch_job(namespace, self._body()))
            if method != "GET":
                return self._send(405, status_body(405, "MethodNotAllowed", method))
            with cluster.lock:
                served = {
                    key: {k: v for k, v in job.items() if not k.startswith("_")}
                    for key, job in cluster.batch_jobs.items()
                }
            if name:
                if (namespace, name) not in served:
                    return self._send(404, status_body(404, "NotFound", f'jobs.batch "{name}" not found'))
                return self._send(200, served[(namespace, name)])
            items = [
                job
                for (ns, _), job in served.items()
                if ns == namespace and matches(job["metadata"].get("labels", {}), query.get("labelSelector"))
            ]
            return self._send(200, {"apiVersion": "batch/v1", "kind": "JobList", "items": items, "metadata": {}})

        def _pods(self, method, namespace, name, log, query):
            if method == "POST" and name is None:
                body = self._body()
                with cluster.lock:
                    if refused := denial(cluster.admission, namespace, body):
                        return self._send(422, status_body(422, "Invalid", refused))
                    cluster._run_pod(namespace, body)
                    return self._send(201, cluster.pods[(namespace, body["metadata"]["name"])].to_api())
            if method == "GET" and name is None:
                return self._send(200, cluster.pod_list(namespace, query.get("labelSelector")))
            pod = cluster.pods.get((namespace, name))
            if pod is None:
                return self._send(404, status_body(404, "NotFound", f'pods "{name}" not found'))
            if not log:
                return self._send(200, pod.to_api())
            # the API server reads query booleans with Go's strconv.ParseBool; the Python client sends "True"
            if query.get("follow") not in ("1", "t", "T", "TRUE", "true", "True"):
                return self._send(200, pod.log.read_bytes() if pod.log.exists() else b"")
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            offset, last = 0, False
            while True:
                # whether the pod has ended is read before its log, so the last read sees all it wrote
                last = pod.phase in ("Succeeded", "Failed") or (namespace, name) not in cluster.pods
                data = pod.log.read_bytes()[offset:] if pod.log.exists() else b""
                if data:
                    offset += len(data)
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                elif last:
                    break
                time.sleep(0.1)
            self.wfile.write(b"0\r\n\r\n")

        def _secrets(self, method, namespace, name):
            """Secrets as their data (stringData, or data in base64) and, apart, their metadata: GET (data in
            base64, as the API serves it), POST/PUT, DELETE, and PATCH of ownerReferences (as `_object`)."""
            key = (namespace, name)
            if method == "GET":
                if key not in cluster.secrets:
                    return self._send(404, status_body(404, "NotFound", f'secrets "{name}" not found'))
                metadata = {"name": name, "namespace": namespace, **cluster.secret_metadata.get(key, {})}
                data = {k: base64.b64encode(v.encode()).decode() for k, v in cluster.secrets[key].items()}
                return self._send(200, {"kind": "Secret", "apiVersion": "v1", "metadata": metadata, "data": data})
            if method in ("DELETE", "PATCH"):
                with cluster.lock:
                    if key not in cluster.secrets:
                        return self._send(404, status_body(404, "NotFound", f'secrets "{name}" not found'))
                    if method == "DELETE":
                        del cluster.secrets[key]
                        cluster.secret_metadata.pop(key, None)
                        return self._send(200, status_body(200, "Success", ""))
                    owners = self._body()["metadata"]["ownerReferences"]
                    cluster.secret_metadata.setdefault(key, {})["ownerReferences"] = owners
                    return self._send(200, {"kind": "Secret", "apiVersion": "v1", "metadata": {"name": name}})
            body = self._body()
            key = (namespace, body["metadata"]["name"])
            if method == "POST" and key in cluster.secrets:
                return self._send(409, status_body(409, "AlreadyExists", f'secrets "{key[1]}" already exists'))
            cluster.secrets[key] = dict(body.get("stringData", {}))
            cluster.secrets[key].update({k: base64.b64decode(v).decode() for k, v in body.get("data", {}).items()})
            if body["metadata"].get("ownerReferences"):
                cluster.secret_metadata.setdefault(key, {})["ownerReferences"] = body["metadata"]["ownerReferences"]
            return self._send(
                201 if method == "POST" else 200,
                {"kind": "Secret", "apiVersion": "v1", "metadata": body["metadata"], "type": "Opaque"},
            )

        def _configmaps(self, method, namespace, name):
            if method == "POST" and name is None:
                return self._send(*cluster.create_configmap(namespace, self._body()))
            return self._object(cluster.configmaps, "configmaps", method, namespace, name)

        def _network_policies(self, method, namespace, name):
            if method == "POST" and name is None:
                return self._send(*cluster.create_network_policy(namespace, self._body()))
            return self._object(cluster.network_policies, "networkpolicies.networking.k8s.io", method, namespace, name)

        def _object(self, objects: dict, resource: str, method: str, namespace: str, name: str | None):
            """GET, DELETE, PUT (replace: the etcd issuer's status), or PATCH of metadata.ownerReferences (what the
            launcher patches: a JSON merge or strategic merge patch replaces that list whole) of one object."""
            with cluster.lock:
                body = objects.get((namespace, name))
                if body is None:
                    return self._send(404, status_body(404, "NotFound", f'{resource} "{name}" not found'))
                if method == "PUT":
                    replaced = self._body()
                    if replaced["metadata"].get("name") != name:
                        return self._send(400, status_body(400, "BadRequest", "the name in the body is not the URL's"))
                    replaced["metadata"].update(namespace=namespace, uid=body["metadata"].get("uid"))
                    objects[(namespace, name)] = replaced
                    return self._send(200, replaced)
                if method == "DELETE":
                    del objects[(namespace, name)]
                    cluster._enforce()
                    return self._send(200, status_body(200, "Success", ""))
                if method == "PATCH":
                    patch = self._body()
                    if set(patch) != {"metadata"} or set(patch["metadata"]) != {"ownerReferences"}:
                        return self._send(422, status_body(422, "Invalid", "only ownerReferences are patched here"))
                    body["metadata"]["ownerReferences"] = patch["metadata"]["ownerReferences"]
                return self._send(200, body)

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

        def do_PUT(self):
            self._route("PUT")

        def do_DELETE(self):
            self._route("DELETE")

        def do_PATCH(self):
            self._route("PATCH")

    return Handler
