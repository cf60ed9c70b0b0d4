"""The Kubernetes API as the EKS backend uses it, through the official Python client.

Only these calls are made (tests/helpers/kube_api.py serves exactly these paths): version; the
kubeflow.org/v1 resource list; create/get/list/delete PyTorchJob; list nodes; get a PVC; list pods
and read their logs; create/read/replace/delete a Secret; create/get/list a batch/v1 Job (data preparation); for
the idle guard, PyTorchJobs and pods listed across all namespaces, its status ConfigMap and Events; for the etcd
issuer, its status ConfigMap (which the launcher reads too).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainkit.errors import SpecError
from trainkit.infra import outputs

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
TIMEOUT_S = 15  # per request: an unreachable API fails in seconds, not minutes


def kubeconfig_path() -> Path:
    """KUBECONFIG, else the one `make up PROFILE=aws` wrote, else kubectl's default."""
    if os.environ.get("KUBECONFIG"):
        return Path(os.environ["KUBECONFIG"].split(os.pathsep)[0]).expanduser()
    written = outputs.kubeconfig_path()
    return written if written.is_file() else Path.home() / ".kube" / "config"


@dataclass
class Kube:
    """API handles for one cluster; `host` is the API server, for messages."""

    core: object
    custom: object
    version: object
    host: str
    batch: object = None
    networking: object = None

    @classmethod
    def connect(cls) -> Kube:
        from kubernetes import client, config

        path = kubeconfig_path()
        if not path.is_file():
            raise SpecError(f"no kubeconfig at {path}: run `make up PROFILE=aws` (it writes one) or set KUBECONFIG")
        configuration = client.Configuration()
        try:
            config.load_kube_config(config_file=str(path), client_configuration=configuration)
        except config.ConfigException as error:
            raise SpecError(f"kubeconfig {path} is not usable ({error}); run `make up PROFILE=aws` again") from None
        configuration.retries = 1
        api = client.ApiClient(configuration)
        return cls(
            client.CoreV1Api(api),
            client.CustomObjectsApi(api),
            client.VersionApi(api),
            configuration.host,
            client.BatchV1Api(api),
            client.NetworkingV1Api(api),
        )


def connect_here() -> Kube:
    """In a pod (the idle guard, the etcd issuer), its service account (KUBERNETES_SERVICE_HOST is set there);
    elsewhere the kubeconfig."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return Kube.connect()
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    api = client.ApiClient(configuration)
    return Kube(client.CoreV1Api(api), client.CustomObjectsApi(api), client.VersionApi(api), configuration.host)


def unless_missing(call, *args, **kwargs):
    """`call(*args, **kwargs)`, or None when the API answers 404 (the object or kind does not exist)."""
    api_error, _ = api_errors()
    try:
        return call(*args, _request_timeout=TIMEOUT_S, **kwargs)
    except api_error as error:
        if error.status != 404:
            raise
        return None


def api_errors():
    """(ApiException, connection errors) for `except` clauses, without importing at module level."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    return ApiException, HTTPError


def stream_lines(response) -> Iterator[str]:
    """Decoded lines of a streamed log, the last one even without its newline."""
    pending = b""
    for chunk in response.stream(4096):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from (line.decode(errors="replace") for line in lines)
    if pending:
        yield pending.decode(errors="replace")
