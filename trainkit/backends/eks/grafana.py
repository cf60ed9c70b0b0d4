"""`invoke obs.grafana`: the platform's Grafana on a local port (kubectl port-forward)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from trainkit.backends.eks.cluster import MONITORING_NAMESPACE, MONITORING_RELEASE
from trainkit.errors import SpecError
from trainkit.infra.outputs import kubeconfig_path


def port_forward_grafana(port: int, kubeconfig: str | None) -> int:
    """`kubectl port-forward` to the platform's Grafana until interrupted; the login is never printed,
    only the Secret it lives in and the command that reads it."""
    config = Path(kubeconfig) if kubeconfig else kubeconfig_path()
    if not config.exists():
        raise SpecError(f"no kubeconfig at {config}: run `make up PROFILE=aws` first, or pass --kubeconfig")
    if shutil.which("kubectl") is None:
        raise SpecError("kubectl is not installed; install it (https://kubernetes.io/docs/tasks/tools/) and retry")
    service, secret = f"svc/{MONITORING_RELEASE}-grafana", f"{MONITORING_RELEASE}-grafana"
    print(
        "\n".join(
            [
                f"Grafana: http://localhost:{port}  (dashboards: GPU fleet, Training run; folder trainkit)",
                f"login:   user admin; the password is in Secret {MONITORING_NAMESPACE}/{secret}, key admin-password:",
                f"         kubectl --kubeconfig {config} -n {MONITORING_NAMESPACE} get secret {secret} "
                "-o jsonpath='{.data.admin-password}' | base64 -d",
                "Ctrl-C stops the port-forward.",
            ]
        ),
        flush=True,
    )
    command = [
        "kubectl",
        "--kubeconfig",
        str(config),
        "-n",
        MONITORING_NAMESPACE,
        "port-forward",
        service,
        f"{port}:80",
    ]
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 0
