"""What one EKS submission creates, and in which order: the objects its pods need first (the NetworkPolicy that
lets them meet, the Secret of their rendezvous key, the ConfigMap of the code it brings), then the PyTorchJob, then
each of the first owned by the job."""

from __future__ import annotations

import base64
import contextlib
import secrets
import sys

from training.spec import Job
from trainkit.backends.eks import cluster, render
from trainkit.backends.eks.kube import GROUP, PLURAL, TIMEOUT_S, VERSION, Kube, api_errors
from trainkit.errors import SpecError
from trainkit.run.workload import Workload


def code_configmap_name(job: Job, token: str) -> str:
    """The code ConfigMap of one submission: `token` is random and new for each (`token()`), so no other job can
    have made a ConfigMap of that name before this submission creates it, before its job."""
    return f"{render.job_name(job.run.run_id)}-code-{token}"


def render_peer_policy(job: Job, rdzv_id: str, token: str) -> dict:
    """The NetworkPolicy that lets one submission's pods reach each other (rendezvous store, NCCL's and gloo's
    sockets, the workers' TCP store on worker 0) and Prometheus reach their metrics ports, and nothing else: the
    platform's default-deny policy isolates every pod of the jobs' namespace (terraform/stacks/platform), and
    policies add up (Kubernetes' NetworkPolicy concept page: "they are additive"). The pods are selected by their
    rendezvous id's label, new for each submission, so another job's pods are never peers. Ingress only: what the
    pods reach outside (etcd, S3, the package index) stays open."""
    pods = {render.LABEL_RDZV: render.rdzv_label(rdzv_id)}
    rules: list[dict] = [{"from": [{"podSelector": {"matchLabels": pods}}]}]
    if ports := render.metrics_ports(job):
        scraper = {"namespaceSelector": {"matchLabels": {render.NAMESPACE_NAME_LABEL: cluster.MONITORING_NAMESPACE}}}
        rules.append({"from": [scraper], "ports": [{"protocol": "TCP", "port": p["containerPort"]} for p in ports]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{render.job_name(job.run.run_id)}-peers-{token}",
            "namespace": job.placement.namespace,
            "labels": {render.LABEL_RUN: render.label_value(job.run.run_id), **render.MANAGED_BY},
        },
        "spec": {"podSelector": {"matchLabels": pods}, "policyTypes": ["Ingress"], "ingress": rules},
    }


def render_code_configmap(job: Job, files: dict[str, bytes], name: str) -> dict:
    """A user's code folder for the pods: UTF-8 files in `data`, anything else in `binaryData` (base64)."""
    data, binary = {}, {}
    for item in render.code_items(files):
        content = files[item["path"]]
        try:
            data[item["key"]] = content.decode()
        except UnicodeDecodeError:
            binary[item["key"]] = base64.b64encode(content).decode()
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": job.placement.namespace,
            "labels": {render.LABEL_RUN: render.label_value(job.run.run_id), **render.MANAGED_BY},
        },
        "immutable": True,  # the code of a submission never changes; a new submission makes a new one
        "data": data,
    }
    if binary:
        body["binaryData"] = binary
    return body


def render_rdzv_secret(job: Job, token: str, key: str | None) -> dict:
    """The Secret holding the key the submission's agents sign their rendezvous state with (trainkit/run/
    rendezvous.py: etcd's and c10d's state is unpickled by every agent, and any pod of the namespace may reach the
    platform's etcd, so a state another job wrote is refused unread). `key` None: the dry run's, which prints no
    key (printed, it would be none); its pods then run unsigned unless one is added before applying."""
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": f"{render.job_name(job.run.run_id)}-rdzv-{token}",
            "namespace": job.placement.namespace,
            "labels": {render.LABEL_RUN: render.label_value(job.run.run_id), **render.MANAGED_BY},
        },
        "type": "Opaque",
    }
    if key is not None:
        body["stringData"] = {render.RDZV_KEY_ITEM: key}
    return body


def token() -> str:
    """Random and new for each submission: the suffix of the names of its ConfigMap and NetworkPolicy, which no
    other job can therefore have taken before them."""
    return secrets.token_hex(5)


def job_objects(
    job: Job,
    workload: Workload,
    rdzv_id: str,
    code: dict[str, bytes] | None,
    token: str,
    key: str | None,
) -> tuple[list[dict], dict]:
    """What one submission creates: the objects its pods need first (the NetworkPolicy that lets them meet, the
    Secret of their rendezvous key, the ConfigMap of the code it brings, if any), then the PyTorchJob. `key`: the
    rendezvous key (None in a dry run)."""
    secret = render_rdzv_secret(job, token, key)
    parts = [render_peer_policy(job, rdzv_id, token), secret]
    code_name = code_configmap_name(job, token) if code is not None else ""
    if code is not None:
        parts.append(render_code_configmap(job, code, code_name))
    manifest = render.render_pytorchjob(job, rdzv_id, workload, code, code_name, secret["metadata"]["name"])
    if job.elastic.rdzv == "etcd" and render.rdzv_endpoint(job) == cluster.etcd_endpoint():
        with_etcd_identity(manifest)
    return parts, manifest


ETCD_IDENTITY_VOLUME = "etcd-identity"


def with_etcd_identity(manifest: dict) -> None:
    """The job's pods mount the etcd identity the platform's issuer writes for the job (trainkit/backends/eks/
    etcd_issuer.py: the Secret `<job>-etcd`, owned by the job) and name its folder to the pod entry point, which
    gives it to the etcd rendezvous: HTTPS, the platform's CA, the job's certificate. The kubelet starts a pod
    once the Secret exists. An etcd of the user's own (--rdzv-endpoint) gets no identity from the platform."""
    template = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    secret = {"secretName": cluster.etcd_identity_secret(manifest["metadata"]["name"]), "defaultMode": 0o440}
    template["spec"]["volumes"].append({"name": ETCD_IDENTITY_VOLUME, "secret": secret})
    container = template["spec"]["containers"][0]
    mount = {"name": ETCD_IDENTITY_VOLUME, "mountPath": cluster.ETCD_TLS_MOUNT, "readOnly": True}
    container["volumeMounts"].append(mount)
    container["env"].append({"name": cluster.ETCD_TLS_ENV, "value": cluster.ETCD_TLS_MOUNT})


PART_CALLS = {  # kind: the Kubernetes client's API attribute on Kube, and the call's name
    "ConfigMap": ("core", "config_map"),
    "Secret": ("core", "secret"),
    "NetworkPolicy": ("networking", "network_policy"),
}


def _part_call(kube: Kube, part: dict, verb: str):
    api, name = PART_CALLS[part["kind"]]
    return getattr(getattr(kube, api), f"{verb}_namespaced_{name}")


def create_job(kube: Kube, job: Job, parts: list[dict], manifest: dict) -> dict:
    """The parts first, so the pods find them when they start, then the job; then each part is owned by the job
    (ownerReferences: deleting the job deletes them). A part's name is new for each submission, so one that exists
    already is refused, never replaced; if the job is not created, the parts made for it are deleted."""
    api_error, connection_error = api_errors()
    namespace, made = job.placement.namespace, []
    try:
        for part in parts:
            try:
                _part_call(kube, part, "create")(namespace, part, _request_timeout=TIMEOUT_S)
            except api_error as error:
                if error.status != 409:
                    raise
                raise SpecError(
                    f"a {part['kind']} named {part['metadata']['name']} already exists in namespace {namespace}, "
                    "although its name is new for this submission: nothing of the job was created; submit again, "
                    "and ask who made it"
                ) from None
            made.append(part)
        created = kube.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, manifest, _request_timeout=TIMEOUT_S
        )
    except BaseException:
        for part in made:
            with contextlib.suppress(Exception):
                _part_call(kube, part, "delete")(part["metadata"]["name"], namespace, _request_timeout=TIMEOUT_S)
        raise
    metadata = created["metadata"]
    owner = {"apiVersion": render.API_VERSION, "kind": "PyTorchJob", "name": metadata["name"], "uid": metadata["uid"]}
    for part in made:
        patch = {"metadata": {"ownerReferences": [owner]}}
        try:
            _part_call(kube, part, "patch")(part["metadata"]["name"], namespace, patch, _request_timeout=TIMEOUT_S)
        except (api_error, connection_error) as error:  # the job runs all the same; only the cleanup is left
            kind, name = part["kind"], part["metadata"]["name"]
            print(
                f"note: the {kind} {name} could not be given to job {metadata['name']} ({error}), so deleting the job "
                f"will not delete it: `kubectl -n {namespace} delete {kind.lower()} {name}` once the job is gone",
                file=sys.stderr,
                flush=True,
            )
    return created
