"""The platform root (terraform/stacks/platform) as python-hcl2 parses it, without its providers: its
resources, variables and locals, and its Kubernetes objects rendered with the variables' defaults and
sample infra outputs (the few HCL expressions the manifests use are evaluated here). `EtcdPod` runs the rendered
etcd pod here on a folder that keeps the kubelet's ownership rules for its volume."""

from __future__ import annotations

import datetime
import functools
import json
import os
import re
import ssl
import stat
import subprocess
from pathlib import Path

import hcl2

from tests.helpers.paths import REPO
from trainkit.backends.eks import cluster
from trainkit.backends.eks.etcd_tls import CertificateAuthority, client_context
from trainkit.run.torchrun import TLS_CA, TLS_CERT, TLS_KEY
from trainkit.services.etcd import etcd_healthy
from trainkit.services.process import free_port_pair, launch, terminate

ROOT = REPO / "terraform" / "stacks" / "platform"
INFRA_SAMPLE = {  # what the infra stack's outputs look like after `make up PROFILE=aws`
    "fsx_file_system_id": "fs-0123456789abcdef0",
    "fsx_dns_name": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
    "fsx_mount_name": "abcdefgh",
    "fsx_storage_capacity_gib": 2400,
    "stack_id": "trainkit-0a1b2c3d",
    "kms_key_arn": "arn:aws:kms:us-east-1:123456789012:key/0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d",
    "gpu_nodes_max": 2,
    "gpus_per_node": 8,
    "submitters": {  # submitter_principal_arns set
        "principal_arns": ["arn:aws:iam::123456789012:role/ml-team"],
        "kubernetes_group": "trainkit-submitters",
        "edit_namespaces": ["trainkit-jobs"],
        "view_namespaces": ["trainkit-system"],
    },
    "idle_guard": {  # idle_guard_minutes = 30
        "cluster_name": "trainkit",
        "region": "us-east-1",
        "nodegroup": "gpu",
        "window_minutes": 30,
        "namespace": "trainkit-system",
        "service_account": "trainkit-idle-guard",
    },
}
# what `make up` passes: the guard's image in its own repository
IDLE_GUARD_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainkit/idle-guard:guard-0123456789ab"


def unquote(value):
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def load(name: str) -> dict:
    with (ROOT / name).open() as handle:
        return hcl2.load(handle)


def blocks(parsed: dict, kind: str) -> dict:
    """{(type, name): body} for resource/data blocks, keys unquoted."""
    found = {}
    for block in parsed.get(kind, []):
        for type_name, named in block.items():
            for name, body in named.items():
                found[(unquote(type_name), unquote(name))] = body
    return found


MAIN = load("main.tf")
RESOURCES = blocks(MAIN, "resource")
VARIABLES = {unquote(k): v for block in load("variables.tf")["variable"] for k, v in block.items()}
DEFAULTS = {name: unquote(body.get("default")) for name, body in VARIABLES.items()}
LOCALS = {k: v for block in MAIN["locals"] for k, v in block.items()}


def evaluate(expression: str, context: dict):
    """The few HCL expressions the manifests use: references, tostring(), merge(x, {literal})."""
    if found := re.fullmatch(r"tostring\((.+)\)", expression):
        return str(evaluate(found[1], context))
    if found := re.fullmatch(r"jsonencode\((.+)\)", expression):
        return json.dumps(evaluate(found[1], context), separators=(",", ":"))
    if found := re.fullmatch(r"merge\(([\w.]+), \{(.*)\}\)", expression):
        return {**evaluate(found[1], context), **dict(re.findall(r'"([^"]+)" = "([^"]*)"', found[2]))}
    value = context
    for part in expression.split("."):
        value = value[part]
    return value


def resolve(value, context: dict):
    if isinstance(value, dict):
        return {unquote(k): resolve(v, context) for k, v in value.items() if k != "__is_block__"}
    if isinstance(value, list):
        return [resolve(v, context) for v in value]
    if not isinstance(value, str):
        return value
    text = unquote(value)
    if text.startswith("${") and text.endswith("}") and text.count("${") == 1:
        return resolve(evaluate(text[2:-1], context), context)
    return re.sub(r"\$\{([^}]+)\}", lambda m: str(evaluate(m[1], context)), text)


def base_context() -> dict:
    context = {"var": DEFAULTS, "local": {"infra": INFRA_SAMPLE}}
    context["local"]["gpu_quota"] = INFRA_SAMPLE["gpu_nodes_max"] * INFRA_SAMPLE["gpus_per_node"]
    for name in (
        "labels",
        "fsx_size",
        "fsx_claims",
        "job_uid",
        "fsx_layout",
        "charts",
        "monitoring_charts",
        "training_pod_monitor",
        "idle_guard_name",
        "etcd_user",
        "etcd_tls_dir",
        "etcd_storage_class",
        "etcd_server_tls",
        "etcd_metrics_port",
        "etcd_issuer_name",
        "pod_capabilities",
        "pod_rules_name",
        "pod_selinux_types",
        "pod_safe_sysctls",
        "submitter_name",
    ):
        context["local"][name] = resolve(LOCALS[name], context)
    # the submitters' group, as `local.submitters` makes it when the infra stack has submitters
    context["local"]["submitters"] = {"group": INFRA_SAMPLE["submitters"]["kubernetes_group"]}
    # the guard's one instance, as `local.idle_guard` makes it when the infra stack has one and its image is pushed
    context["local"]["idle_guard"] = {"guard": {**INFRA_SAMPLE["idle_guard"], "image": IDLE_GUARD_IMAGE}}
    # the etcd issuer's one instance, as `local.etcd_issuer` makes it when the platform's image is pushed
    context["local"]["etcd_issuer"] = {"issuer": IDLE_GUARD_IMAGE}
    context["local"]["etcd_issuer_namespaces"] = {
        "system": DEFAULTS["system_namespace"],
        "jobs": DEFAULTS["jobs_namespace"],
    }
    return context


FILTER = re.compile(r"\$\{\{for (\w+), (\w+) in ([\w.]+) : \1 => \2 if (!?)\2\.(\w+)\}\}")


def selected(body: dict, context: dict) -> dict:
    """The map a for_each iterates: a reference, or `{for k, v in MAP : k => v if [!]v.FIELD}`."""
    expression = unquote(body["for_each"])
    if found := FILTER.fullmatch(expression):
        items = evaluate(found[3], context)
        return {key: value for key, value in items.items() if bool(value[found[5]]) != bool(found[4])}
    return resolve(expression, context)


def instances(body: dict, context: dict):
    """(each.key, each.value) for a resource's for_each, or one instance without it."""
    if "for_each" not in body:
        yield None, None
        return
    expression = unquote(body["for_each"])
    if found := re.fullmatch(r"\$\{toset\(\[(.+)\]\)\}", expression):
        for item in found[1].split(", "):
            value = evaluate(item, context)
            yield value, value
    else:
        yield from resolve(expression, context).items()


def manifests() -> list[tuple[str, dict]]:
    context = base_context()
    rendered = []
    for (kind, name), body in RESOURCES.items():
        if kind != "kubernetes_manifest":
            continue
        for key, value in instances(body, context):
            each = {**context, "each": {"key": key, "value": value}}
            rendered.append((f"{name}[{key}]" if key else name, resolve(body["manifest"], each)))
    return rendered


def etcd_pod() -> dict:
    """The etcd StatefulSet's pod spec, as rendered."""
    (pod,) = [obj["spec"]["template"]["spec"] for _, obj in manifests() if obj["kind"] == "StatefulSet"]
    return pod


class EtcdPod:
    """The platform's etcd pod, run here as the kubelet runs it on its EBS volume.

    `volume_root` stands in for the root of the new ext4 file system the EBS CSI driver formats (root's, 0755, as
    mkfs leaves it). The driver's fsGroupPolicy is File, so before the container starts the kubelet gives the
    volume to the pod's fsGroup (kubernetes pkg/volume/volume_linux.go, SetVolumeOwnership: every file and folder
    gets the group, group read and write, folders group execute and setgid; with fsGroupChangePolicy OnRootMismatch
    nothing is changed once the root already has that group and those rights). The Secret volume of etcd's
    certificate is `tls`, a folder holding tls.crt, tls.key and ca.crt (the issuer's Secret: `server_tls` writes one
    for a CA), its files given to fsGroup with the volume's mode, as the kubelet does. The container then runs its
    rendered command, its mount paths mapped to those folders and etcd's ports to free ones, under setpriv as the
    user, group, supplementary group (fsGroup) and capabilities its securityContext names: a step that needs more
    than it declares fails here as on the node."""

    def __init__(self, volume_root: Path, log_path: Path, pod: dict | None = None, tls: Path | None = None):
        self.root, self.log_path = volume_root, log_path
        self.pod = pod or etcd_pod()
        self.port = free_port_pair()
        self.metrics_port = free_port_pair()
        self.process: subprocess.Popen | None = None
        self.authority = None if tls else CertificateAuthority.create()  # the test's CA, when it brings no Secret
        self.tls = tls or server_tls(volume_root.parent / f"{volume_root.name}-tls", self.authority)

    def url(self, path: str) -> tuple[str, ssl.SSLContext]:
        """https://127.0.0.1:port/path, and a context that trusts the CA and presents a client certificate of it."""
        issued = self.authority.issue("test-client", datetime.timedelta(hours=1))
        with client_context(self.authority.cert, issued) as context:
            return f"https://{self.endpoint}{path}", context

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def folder(self, mount: dict) -> Path:
        return self.tls if mount["name"] == "tls" else self.root

    def mount(self) -> None:
        """The kubelet's part: the volume given to fsGroup (as SetVolumeOwnership, under the pod's
        fsGroupChangePolicy), and the Secret's files given to fsGroup with the volume's defaultMode."""
        context = self.pod["securityContext"]
        group = context.get("fsGroup")
        if group is not None:
            root = self.root.stat()
            wanted = 0o060 | stat.S_ISGID | 0o010
            mismatch = root.st_gid != group or root.st_mode & wanted != wanted
            if context.get("fsGroupChangePolicy") != "OnRootMismatch" or mismatch:
                for path in [self.root, *self.root.rglob("*")]:
                    os.chown(path, -1, group)
                    extra = 0o660 | (stat.S_ISGID | 0o110 if path.is_dir() else 0)
                    path.chmod(stat.S_IMODE(path.stat().st_mode) | extra)
        (secret,) = [volume["secret"] for volume in self.pod["volumes"] if "secret" in volume]
        self.tls.chmod(0o755)
        for path in self.tls.iterdir():
            os.chown(path, 0, group or 0)
            path.chmod(secret.get("defaultMode", 0o644))

    def command(self, container: dict) -> list[str]:
        """setpriv as the container's user, group and capabilities, then its command on this machine's paths."""
        identity = as_container_user(self.pod, container)
        paths = {mount["mountPath"]: str(self.folder(mount)) for mount in container["volumeMounts"]}
        ports = {"2379": self.port, "2380": self.port + 1, "2381": self.metrics_port}

        def here(arg: str) -> str:
            for path, folder in paths.items():
                arg = re.sub(rf"(^|=){re.escape(path)}(?=/|$)", rf"\g<1>{folder}", arg)
            return re.sub(r"(https?)://[^:/]+:(2379|2380|2381)", lambda m: f"{m[1]}://127.0.0.1:{ports[m[2]]}", arg)

        return identity + [here(arg) for arg in [*container["command"], *container.get("args", [])]]

    def start_etcd(self, timeout: float = 15) -> None:
        """Start the etcd container; once it answers /health (on its metrics port) it has written its data directory."""
        (container,) = self.pod["containers"]
        ready = functools.partial(etcd_healthy, f"127.0.0.1:{self.metrics_port}")
        self.process = launch(self.command(container), self.log_path, ready, "etcd", timeout, detach=False)

    def stop(self) -> None:
        terminate(self.process)


def as_container_user(pod: dict, container: dict) -> list[str]:
    """setpriv as `container` of `pod` runs: its user and group (the pod's unless the container's own), the pod's
    fsGroup as its one supplementary group, only the capabilities it adds, no new privileges where it says so. The
    kubelet refuses runAsNonRoot with uid 0; the stand-ins run only containers that drop ALL capabilities."""
    context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    uid, gid = context.get("runAsUser", 0), context.get("runAsGroup", 0)
    if context.get("runAsNonRoot") and uid == 0:
        raise ValueError(f"{container['name']}: runAsNonRoot with runAsUser 0, which the kubelet refuses")
    capabilities = context.get("capabilities", {})
    if "ALL" not in capabilities.get("drop", []):
        raise ValueError(f"{container['name']}: the stand-in runs containers that drop ALL capabilities")
    kept = ",".join(["-all", *(f"+{name.lower()}" for name in capabilities.get("add", []))])
    groups = f"--groups={context['fsGroup']}" if "fsGroup" in context else "--clear-groups"
    identity = ["setpriv", f"--reuid={uid}", f"--regid={gid}", groups, "--inh-caps=-all", f"--bounding-set={kept}"]
    if context.get("allowPrivilegeEscalation") is False:
        identity.append("--no-new-privs")
    return identity


def server_tls(folder: Path, ca: CertificateAuthority, names: list[str] | None = None) -> Path:
    """The Secret of etcd's certificate as the issuer writes it (trainkit/backends/eks/etcd_issuer.py), as files:
    a certificate from `ca` for the Service's names and 127.0.0.1 (what the tests dial), its key, the CA's."""
    folder.mkdir(parents=True, exist_ok=True)
    issued = ca.issue("trainkit-etcd", datetime.timedelta(days=1), names or [*cluster.etcd_server_names(), "127.0.0.1"])
    for name, content in ((TLS_CERT, issued.cert), (TLS_KEY, issued.key), (TLS_CA, ca.cert)):
        (folder / name).write_bytes(content)
    return folder
