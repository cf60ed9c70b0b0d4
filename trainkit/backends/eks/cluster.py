"""The names the platform stack creates on the EKS cluster (namespaces, services, the FSx claim, the token's
Secret): the contract between `terraform/stacks/platform` (which creates the objects) and the EKS backend (which
refers to them); tests/unit/test_platform_stack.py checks both sides agree. The infra stack's outputs:
trainkit/infra/outputs.py."""

from __future__ import annotations

from observability.contract import MONITORING_NAMESPACE as MONITORING_NAMESPACE  # re-exported

JOBS_NAMESPACE = "trainkit-jobs"
"""Namespace for training jobs (ResourceQuota, FSx claim and the HF token Secret live there)."""
PLATFORM_NAMESPACE = "trainkit-system"
"""Namespace of the platform's own services (etcd)."""
# kube-prometheus-stack and dcgm-exporter; Grafana's service is <release>-grafana.

MONITORING_RELEASE = "kube-prometheus-stack"
METRICS_PORT_NAME = "metrics-{rank}"
"""Container port name of each local rank's metrics; the platform's PodMonitor keeps ports named so."""
ETCD_SERVICE = "trainkit-etcd"
ETCD_PORT = 2379
FSX_CLAIM = "fsx-shared"
# The data-preparation job's service account (platform stack) with read access to data_source_buckets (infra stack).
DATA_SERVICE_ACCOUNT = "trainkit-data"
TRAINING_SERVICE_ACCOUNT = "trainkit-training"
"""A training job's service account when it logs to a SageMaker managed MLflow tracking server: EKS Pod Identity gives
it the infra stack's training role (terraform/modules/eks `training_identity`; the platform stack creates it)."""
"""PersistentVolumeClaim (ReadWriteMany) bound to the infra stack's FSx for Lustre file system."""
FSX_MOUNT = "/fsx"
"""Where every training pod mounts the FSx claim; runs live in /fsx/<runs_dir>/<run-id>/."""
JOB_UID = 1000
"""The user (and group) every job's and data job's container runs as, on EKS and Batch; the FSx root is theirs
(trainkit/backends/eks/fsx.py), and the training image names it `trainkit` (containers/train/Dockerfile)."""
FSX_LAYOUT = "trainkit-fsx-layout"
"""The platform's Job (PLATFORM_NAMESPACE) that gives the FSx root to JOB_UID (trainkit/backends/eks/fsx.py)."""
JOB_HOME = "/home/trainkit"
"""The jobs' home folder: the image's `trainkit` user's; on EKS an emptyDir, so any image's user can write there."""
HF_TOKEN_SECRET = "hf-token"
SECRET_KEY = "token"
"""The key of every credential's Secret (trainkit/run/secrets.py: the Secret is named as the credential)."""
IDLE_GUARD = "trainkit-idle-guard"
"""The idle guard's CronJob, ServiceAccount and status ConfigMap, in PLATFORM_NAMESPACE (trainkit/backends/eks/
idle_guard.py; the platform stack creates the first two when the infra stack's idle_guard_minutes is set)."""
GUARD_LABELS = {"app.kubernetes.io/name": IDLE_GUARD, "app.kubernetes.io/part-of": "trainkit"}
C10D_PORT = 29400
"""Port of the c10d rendezvous store on worker 0 (torchrun's default)."""
ETCD_METRICS_PORT = 2381
"""etcd's plain-HTTP /health and /metrics (--listen-metrics-urls): the client port asks for a certificate."""
ETCD_ISSUER = "trainkit-etcd-issuer"
"""The Deployment and ServiceAccount, in PLATFORM_NAMESPACE, that hold the etcd CA and give each job its etcd
identity (trainkit/backends/eks/etcd_issuer.py)."""
ETCD_CA_SECRET = "trainkit-etcd-ca"
"""The CA's certificate and key (PLATFORM_NAMESPACE): the issuer creates it on its first start and alone reads it."""
ETCD_SERVER_SECRET = "trainkit-etcd-server"
"""etcd's serving certificate, key and the CA's certificate (PLATFORM_NAMESPACE), mounted by etcd."""
ETCD_TLS_MOUNT = "/etc/trainkit/etcd"
"""Where a training pod mounts its job's etcd identity (tls.crt, tls.key, ca.crt)."""
ETCD_TLS_ENV = "TRAINKIT_ETCD_TLS"
"""The pod's environment entry naming that folder; the pod entry point passes it to the etcd rendezvous."""


def etcd_endpoint() -> str:
    return f"{ETCD_SERVICE}.{PLATFORM_NAMESPACE}.svc:{ETCD_PORT}"


def etcd_identity_secret(job_name: str) -> str:
    """The Secret (JOBS_NAMESPACE) the issuer writes a job's etcd identity into, owned by the job."""
    return f"{job_name}-etcd"


def etcd_server_names() -> list[str]:
    """The names etcd's certificate holds: its Service as pods reach it, short and long."""
    service = f"{ETCD_SERVICE}.{PLATFORM_NAMESPACE}"
    return [ETCD_SERVICE, service, f"{service}.svc", f"{service}.svc.cluster.local"]
