"""`invoke obs.grafana`: what it runs, what it prints, what it refuses."""

from __future__ import annotations

import os
import stat

from tests.helpers.product import invoke


def fake_kubectl(folder) -> dict:
    """A kubectl on PATH that records its arguments (port-forward needs a cluster we do not have)."""
    script = folder / "kubectl"
    script.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$(dirname "$0")/args"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def test_grafana_port_forwards_and_prints_where_the_login_is(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    result = invoke("obs.grafana", "--port", "3300", "--kubeconfig", str(kubeconfig), env=fake_kubectl(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "http://localhost:3300" in result.stdout
    assert "Secret trainkit-monitoring/kube-prometheus-stack-grafana, key admin-password" in result.stdout
    args = (tmp_path / "args").read_text().split()
    assert args == ["--kubeconfig", str(kubeconfig), "-n", "trainkit-monitoring", "port-forward"] + [
        "svc/kube-prometheus-stack-grafana",
        "3300:80",
    ]


def test_grafana_without_a_cluster_says_what_to_do(tmp_path):
    result = invoke("obs.grafana", env={"TRAINKIT_STATE_DIR": str(tmp_path)})
    assert result.returncode == 2 and "make up PROFILE=aws" in result.stderr
    assert not result.stdout
