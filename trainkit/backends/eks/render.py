"""Kubernetes objects built from a validated job spec, as plain dicts (never text templates).

`render_pytorchjob` is the whole EKS job: a Kubeflow training-operator v1 PyTorchJob with an elastic
policy and one worker replica per node. Whatever the workload (a recipe, a user's script, the collective sweep),
the workers run `python -m trainkit.backends.eks.pod`, which prepares the run directory on the FSx volume with the
same code as the local target and then starts torchrun on the workload (`TRAINKIT_WORKLOAD`). Field names follow
the training-operator v1 CRD (tests/schemas/pytorchjob-v1.json keeps the part we use) and the Kubernetes core API
(checked with kubernetes-validate).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace

from training.spec import Job
from trainkit import hardware
from trainkit.backends.eks import cluster, fsx, resources
from trainkit.job.models import downloads_weights
from trainkit.run.secrets import HF_TOKEN, MLFLOW_TOKEN, Credential, sends_token
from trainkit.run.torchrun import RDZV_KEY_ENV, TORCH_ENV
from trainkit.run.workload import WORKLOAD_ENV, Workload

API_VERSION = "kubeflow.org/v1"
CONTAINER = "pytorch"  # the training operator looks for this container name
LABEL_RUN = "trainkit/run-id"
LABEL_MODEL = "trainkit/model"
LABEL_RDZV = "trainkit/rdzv-id"
MANAGED_BY = {"app.kubernetes.io/managed-by": "trainkit"}
# torchrun gives workers 30 s to stop after SIGTERM (they checkpoint when time allows, README
# "Elastic training"); the kubelet must wait at least that long before it kills the pod (also at --max-runtime).
TERMINATION_GRACE_S = 60
# Environment for NCCL over EFA (aws-ofi-nccl), set on the pod so that an image of the user's gets it too (the
# training image sets the first two as well): the EFA libfabric provider only; NCCL's sockets not on loopback,
# docker bridges, veth pairs or EKS Pod Identity's pod-id-link0 (aws-samples/aws-do-eks#54); NCCL's own log (what
# `invoke nccl-test` checks), and a failed collective ends the process instead of hanging. Not
# FI_EFA_USE_DEVICE_RDMA: libfabric >= 1.18 uses GPUDirect RDMA where the instance has it (p4d, p5) and forcing it
# fails where it has not (aws-ofi-nccl doc/efa-env-var.md).
NCCL_EFA_ENV = {
    "FI_PROVIDER": "efa",
    "NCCL_SOCKET_IFNAME": "^lo,docker,veth,pod-id-link",
    "NCCL_DEBUG": "INFO",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}
POD_ENTRY = ["python", "-m", "trainkit.backends.eks.pod"]
# Where a user's code (a script's folder) is mounted in the pods from its ConfigMap, read-only.
CODE_MOUNT = "/trainkit/code"
CODE_VOLUME = "code"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server (v1.21+)
RDZV_KEY_ITEM = "key"  # the item of a submission's rendezvous key Secret
MAX_NAME = 45  # the operator names pods and services <job>-worker-<i>; keep that under 63 characters


def job_name(run_id: str) -> str:
    """A DNS-1035 label from the run id (lower case, digits, '-'); a hash keeps altered ids distinct."""
    name = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"run-{name}"
    if name != run_id or len(name) > MAX_NAME:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:6]
        name = f"{name[: MAX_NAME - 7].rstrip('-')}-{digest}"
    return name


def label_value(text: str) -> str:
    """Label values allow 63 characters of [A-Za-z0-9._-], starting and ending alphanumeric."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63].strip("-._")


def rdzv_label(rdzv_id: str) -> str:
    """The pods' label of their submission: the rendezvous id's last 63 characters, whose end is the random part
    (rendezvous_id), so two submissions of one long run id never share it (the submission's NetworkPolicy selects
    its pods by it)."""
    return label_value(re.sub(r"[^A-Za-z0-9._-]+", "-", rdzv_id)[-63:].lstrip("-._"))


# Training replicas restart by exit code (training-operator v1.9.4: the pods get restartPolicy Never, pkg/core/pod.go
# SetRestartPolicy; a failed pod whose container exited with 128 or more is deleted and created again, one that
# exited with 1-127 fails the job, pkg/controller.v1/common/pod.go ReconcilePods and pkg/util/train/train_util.go).
# The pod entry point chooses the code (trainkit/backends/eks/pod.py): a failure no restart mends ends the job at
# once instead of being restarted in place until the backoff limit.
RESTART_BY_EXIT_CODE = "ExitCode"
# The container's terminationMessagePath (Kubernetes' default, stated). The kubelet mounts a file of the pod's there
# and reads at most 4096 bytes of it into status.containerStatuses[].state.terminated.message; under
# FallbackToLogsOnError an empty file on a failed exit gives the log's last 80 lines or 2048 bytes instead
# (kubernetes.io/docs/tasks/debug/debug-application/determine-reason-pod-failure).
TERMINATION_LOG = "/dev/termination-log"


@dataclass(frozen=True)
class Container:
    """What the workers' container runs: its command, args and environment, the replicas' restart policy, and
    what the model label says (a recipe: the model's name)."""

    label: str
    command: list[str]
    args: list[str]
    env: list[dict]
    restart_policy: str = RESTART_BY_EXIT_CODE


def job_labels(job: Job, container: Container) -> dict[str, str]:
    return {LABEL_RUN: label_value(job.run.run_id), LABEL_MODEL: label_value(container.label), **MANAGED_BY}


def rdzv_endpoint(job: Job) -> str:
    """etcd: the platform's service (or --rdzv-endpoint). c10d: worker 0's per-replica service."""
    return job.elastic.rdzv_endpoint or f"{job_name(job.run.run_id)}-worker-0:{cluster.C10D_PORT}"


def _elastic_policy(job: Job, rdzv_id: str) -> dict:
    """What the operator needs to run an elastic job; the pods pass torchrun the same values explicitly
    (and the rendezvous tuning, trainkit/run/torchrun.py), since the operator knows no `trainkit-etcd`."""
    host, _, port = rdzv_endpoint(job).rpartition(":")
    return {
        "rdzvBackend": job.elastic.rdzv,
        "rdzvHost": host,
        "rdzvPort": int(port),
        "rdzvId": rdzv_id,
        "minReplicas": job.parallelism.min_nodes,
        "maxReplicas": job.parallelism.nodes,
        "maxRestarts": job.elastic.max_restarts,
    }


def worker_env(**plain: str) -> list[dict]:
    """NCCL's and torchrun's variables, `plain` ones, and the pod's own name (the downward API)."""
    env = [{"name": name, "value": value} for name, value in {**NCCL_EFA_ENV, **TORCH_ENV, **plain}.items()]
    env.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    return env


def _env(job: Job, workload: Workload, key_secret: str = "") -> list[dict]:
    """The spec and the workload travel as JSON (they hold no secrets); the token comes from the Secret, never a
    value, and only to a workload that may read it. `key_secret`: the Secret of the submission's rendezvous key
    (trainkit/backends/eks/submission.py), optional: a dry run's has no key, and its pods then sign nothing."""
    env = worker_env(TRAINKIT_SPEC=json.dumps(job.to_dict(), sort_keys=True), **{WORKLOAD_ENV: workload.to_json()})
    if key_secret:
        env.append(secret_env(RDZV_KEY_ENV, key_secret, RDZV_KEY_ITEM, optional=True))
    if workload.token:
        # Weights from the hub need it (a model folder on the volume does not); otherwise it only opens gated datasets.
        optional = job.run.workload != "recipe" or not downloads_weights(job)
        env.append(secret_env(HF_TOKEN.env, HF_TOKEN.name, cluster.SECRET_KEY, optional))
    if sends_token(job):  # a server that takes none runs the job without it
        env.append(secret_env(MLFLOW_TOKEN.env, MLFLOW_TOKEN.name, cluster.SECRET_KEY, optional=True))
    return env


def secret_env(name: str, secret: str, key: str, optional: bool) -> dict:
    """An environment variable from a Secret's key. Optional: the container starts without it when the Secret or the
    key is missing; otherwise the kubelet holds the container (CreateContainerConfigError) until it exists
    (EnvVarSource.secretKeyRef, SecretKeySelector.optional)."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": optional}}}


# No privilege escalation and no capability. EFA (libfabric's efa provider) and NCCL register pinned memory with the
# device, within RLIMIT_MEMLOCK (mlock(2)); IPC_LOCK would lift that limit, but a capability added to a non-root
# container only reaches its bounding set, never the process (capabilities(7): Kubernetes sets no ambient set). So
# the GPU nodes raise the containers' memlock limit instead (terraform/modules/gpu-nodegroup, its NodeConfig).
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def container_of(job: Job, rdzv_id: str, workload: Workload, key_secret: str = "") -> Container:
    """The pod entry point on the workload; one that must not be retried fails the job at its first failure."""
    args = ["--rdzv-endpoint", rdzv_endpoint(job), "--rdzv-id", rdzv_id]
    policy = RESTART_BY_EXIT_CODE if workload.restarts else "Never"
    return Container(workload.label, POD_ENTRY, args, _env(job, workload, key_secret), restart_policy=policy)


def _container(job: Job, workload: Container) -> dict:
    instance = hardware.INSTANCE_TYPES[job.placement.instance_type]
    return {
        "name": CONTAINER,
        "image": job.placement.image,
        "imagePullPolicy": "IfNotPresent",
        "command": workload.command,
        "args": workload.args,
        "workingDir": cluster.FSX_MOUNT,
        "env": [*workload.env, {"name": "HOME", "value": cluster.JOB_HOME}],
        "resources": resources.worker_resources(instance, job.parallelism.nproc),  # Guaranteed QoS
        "securityContext": CONTAINER_SECURITY,
        # The pod entry point writes the failure's cause here; without it (a crash before), the log's tail.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "ports": [{"name": "c10d", "containerPort": cluster.C10D_PORT, "protocol": "TCP"}, *metrics_ports(job)],
        "volumeMounts": [*fsx.job_mounts(job), {"name": "dshm", "mountPath": "/dev/shm"}],
    }


def metrics_ports(job: Job) -> list[dict]:
    """One named port per local rank (rank r serves metrics_port + r) for the platform's PodMonitor."""
    if not job.run.metrics_port:
        return []
    return [
        {"name": cluster.METRICS_PORT_NAME.format(rank=r), "containerPort": job.run.metrics_port + r, "protocol": "TCP"}
        for r in range(job.parallelism.nproc)
    ]


def render_pod_template(job: Job, rdzv_id: str, workload: Container) -> dict:
    # Nothing in a training pod talks to the Kubernetes API; AWS credentials only where it logs to a SageMaker managed
    # MLflow tracking server, whose requests they sign: EKS Pod Identity gives them to the training service account
    # through the agent's own projected token.
    identity = {"serviceAccountName": cluster.TRAINING_SERVICE_ACCOUNT} if signs_requests(job) else {}
    return {
        "metadata": {"labels": {**job_labels(job, workload), LABEL_RDZV: rdzv_label(rdzv_id)}},
        "spec": {
            **identity,
            "nodeSelector": {"node.kubernetes.io/instance-type": job.placement.instance_type, "trainkit/pool": "gpu"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
            "automountServiceAccountToken": False,
            "securityContext": {**fsx.POD_USER, "seccompProfile": {"type": "RuntimeDefault"}},
            "initContainers": [fsx.folders_container(job)],
            "containers": [_container(job, workload)],
            "volumes": [
                {"name": fsx.VOLUME, "persistentVolumeClaim": {"claimName": cluster.FSX_CLAIM}},
                {"name": fsx.HOME_VOLUME, "emptyDir": {}},
                # NCCL and data loader workers share memory through /dev/shm; the default 64 MiB is too small.
                {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            ],
        },
    }


def signs_requests(job: Job) -> bool:
    """Whether the job's pods log to a SageMaker managed MLflow tracking server (an ARN), with AWS credentials."""
    return job.tracking.enabled and str(job.tracking.uri or "").startswith("arn:")


def code_items(files: dict[str, bytes]) -> list[dict]:
    """ConfigMap keys are flat ([-._a-zA-Z0-9]+): one key per file, mapped back to its path in the volume."""
    return [{"key": f"file-{index:03d}", "path": name} for index, name in enumerate(sorted(files))]


def _with_code(template: dict, files: dict[str, bytes], name: str) -> None:
    """The code ConfigMap `name`, read-only at CODE_MOUNT in every worker."""
    spec = template["spec"]
    configmap = {"name": name, "items": code_items(files)}
    spec["volumes"].append({"name": CODE_VOLUME, "configMap": configmap})
    spec["containers"][0]["volumeMounts"].append({"name": CODE_VOLUME, "mountPath": CODE_MOUNT, "readOnly": True})


def render_pytorchjob(
    job: Job,
    rdzv_id: str,
    job_workload: Workload,
    code: dict[str, bytes] | None = None,
    code_name: str = "",
    key_secret: str = "",
) -> dict:
    """The job that runs `job_workload` on every worker pod; `code`: the user's code folder the workload brings
    (a script's), which the pods read from its ConfigMap `code_name` (render_code_configmap) at CODE_MOUNT;
    `key_secret`: the Secret of the submission's rendezvous key."""
    if code is not None:
        job_workload = replace(job_workload, code=CODE_MOUNT)
    workload = container_of(job, rdzv_id, job_workload, key_secret)
    restarts = job.elastic.max_restarts if job_workload.restarts else 0
    template = render_pod_template(job, rdzv_id, workload)
    if code is not None:
        _with_code(template, code, code_name)
    run_policy = {"cleanPodPolicy": "Running", "backoffLimit": restarts}
    if job.placement.max_runtime is not None:
        # training-operator v1.9.4: the clock starts when PyTorchJobReconciler.UpdateJobStatus first sets
        # status.startTime (pkg/controller.v1/pytorch/pytorchjob_controller.go): scheduling and image pulls count.
        # Past core.PastActiveDeadline (pkg/core/job.go), JobController.ReconcileJobs (pkg/controller.v1/common/
        # job.go) fails the job and deletes its running pods, which get TERMINATION_GRACE_S. A new submission is a
        # new job: a fresh window.
        run_policy["activeDeadlineSeconds"] = job.placement.max_runtime
    return {
        "apiVersion": API_VERSION,
        "kind": "PyTorchJob",
        "metadata": {
            "name": job_name(job.run.run_id),
            "namespace": job.placement.namespace,
            "labels": job_labels(job, workload),
            "annotations": {LABEL_RUN: job.run.run_id},
        },
        "spec": {
            "runPolicy": run_policy,
            "elasticPolicy": {**_elastic_policy(job, rdzv_id), "maxRestarts": restarts},
            "nprocPerNode": str(job.parallelism.nproc),
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": job.parallelism.nodes,
                    "restartPolicy": workload.restart_policy,
                    "template": template,
                }
            },
        },
    }


PREP_CONTAINER = "prep"
LABEL_DATA_DEST = "trainkit/data-dest"
# The copy is I/O-bound (threads waiting on S3 and FSx): one CPU and a few GiB fit the system nodes beside the
# platform's services. A failed pod is replaced up to this many times; each new pod resumes the copy.
PREP_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "6Gi"}}
PREP_BACKOFF_LIMIT = 3
# training.vision.prep exits 2 for what a retry cannot mend (a wrong bucket or key, no access, a bad tree): the
# Job fails at once with the pod's log instead of repeating it (batch/v1 podFailurePolicy, GA in Kubernetes 1.31).
PREP_FATAL_EXIT_CODES = [2]
PREP_TTL_S = 7 * 24 * 3600  # the finished Job (and its pod's log) stays a week, then Kubernetes removes it


def render_prep_job(
    name: str,
    namespace: str,
    image: str,
    args: list[str],
    dest_label: str,
    zone: str | None,
    dest: str | None = None,
    module: str = "training.vision.prep",
) -> dict:
    """A batch/v1 Job running `python -m module` (the data copy: training.vision.prep) on the FSx volume (the
    working directory is its mount, so relative paths land on FSx) as the data service account, which EKS Pod
    Identity gives read access to the infra stack's data_source_buckets. It runs on the system (CPU) nodes,
    preferring the FSx file system's zone (`zone`), since the copy needs no GPU."""
    labels = {LABEL_DATA_DEST: label_value(dest_label), **MANAGED_BY}
    pod = {
        "serviceAccountName": cluster.DATA_SERVICE_ACCOUNT,
        # Pod Identity's credentials come through the agent's own projected token, not the API token.
        "automountServiceAccountToken": False,
        "restartPolicy": "Never",
        "nodeSelector": {"trainkit/pool": "system"},
        # The data job writes its destination anywhere on the volume: it mounts all of it, as the jobs' user.
        "securityContext": {**fsx.POD_USER, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": PREP_CONTAINER,
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["python", "-m", module],
                "args": args,
                "workingDir": cluster.FSX_MOUNT,
                "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                "resources": PREP_RESOURCES,
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "fsx", "mountPath": cluster.FSX_MOUNT}],
            }
        ],
        "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": cluster.FSX_CLAIM}}],
    }
    if zone:
        preference = {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}]}
        pod["affinity"] = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": preference}]
            }
        }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            **({"annotations": {LABEL_DATA_DEST: dest}} if dest else {}),  # the label is a hash; this, the path
        },
        "spec": {
            "backoffLimit": PREP_BACKOFF_LIMIT,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": PREP_CONTAINER,
                            "operator": "In",
                            "values": PREP_FATAL_EXIT_CODES,
                        },
                    }
                ]
            },
            "ttlSecondsAfterFinished": PREP_TTL_S,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }


def render_secret(credential: Credential, token: str, namespace: str) -> dict:
    """The only object that carries the credential; created by `invoke secrets.<name>`, never printed."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": credential.name, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "type": "Opaque",
        "stringData": {cluster.SECRET_KEY: token},
    }
