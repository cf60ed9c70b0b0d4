"""Fixtures of the e2e layer: real training runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tests.helpers.product import only_run_dir
from trainkit.services import free_port_pair


@pytest.fixture(scope="session")
def tiny_make_train(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The first-contact command, `make train MODEL=llama2-tiny`, run once for the session: (its run folder,
    what it printed)."""
    runs = tmp_path_factory.mktemp("tiny")
    port = free_port_pair()
    result = subprocess.run(
        # --no-print-directory: what `make train` prints at a shell, also when the suite itself runs under make
        ["make", "--no-print-directory", "train", "MODEL=llama2-tiny", f"ARGS=--runs-dir {runs} --metrics-port {port}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return only_run_dir(runs), result


@pytest.fixture(scope="session")
def tiny_run(tiny_make_train) -> Path:
    """The run folder of the session's `make train MODEL=llama2-tiny`."""
    return tiny_make_train[0]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1 for the session, standing in for a team's server or SageMaker's managed one:
    the cloud stand-ins' jobs log to it (their hosts and nodes reach it through their network's gateway)."""
    from trainkit.services.mlflow import MlflowServer

    with MlflowServer(tmp_path_factory.mktemp("mlflow-server") / "mlflow.db") as server:
        yield server


@pytest.fixture
def gated_mlflow(mlflow_server):
    """The session's MLflow server as a team runs one, behind a proxy that takes only requests with its bearer token
    (tests/helpers/tracked.py TokenGate): a job reaches it only with the token its target's secret gave it."""
    from tests.helpers.tracked import TokenGate

    with TokenGate(mlflow_server.url, "mlflow-token-never-shown") as gate:
        yield gate
