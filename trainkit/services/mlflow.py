"""An MLflow tracking server with its UI on 127.0.0.1 (issue 54): over the runs folder's embedded store for
`invoke obs.mlflow`, or over a store of its own where the tests stand it in for a team's server or SageMaker's
managed one.

It is MLflow's own server (`mlflow server`, from the full `mlflow` package: the `tracking-ui` extra). The workers
need only the client (mlflow-skinny), so the training image does not carry the server, its UI and their
dependencies."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from trainkit.errors import SpecError
from trainkit.services.process import OwnedServer, free_port_pair, http_ok, launch

INSTALL = "pip install 'trainkit[tracking-ui]' (MLflow's server and UI; the workers need only mlflow-skinny)"


def mlflow_command() -> list[str]:
    """`mlflow` of this environment (the launcher's venv), not whatever PATH finds first."""
    beside = Path(sys.executable).with_name("mlflow")
    found = str(beside) if beside.is_file() else shutil.which("mlflow")
    try:
        import mlflow.server  # noqa: F401  (mlflow-skinny has the `mlflow` command, not the server)
    except ImportError:
        found = None
    if found is None:
        raise SpecError(f"MLflow's server is not installed: {INSTALL}")
    return [found]


class MlflowServer(OwnedServer):
    """`mlflow server` over `store` (a SQLite file), its artifacts under `artifacts` (runs that name their own
    artifact location, as the embedded store's experiments do, keep theirs), on 127.0.0.1:`port`."""

    def __init__(self, store: Path, port: int | None = None, artifacts: Path | None = None, log: Path | None = None):
        self.store = Path(store).resolve()
        self.port = port or free_port_pair()
        self.artifacts = Path(artifacts or self.store.parent / "mlartifacts").resolve()
        self.log_path = Path(log or self.store.parent / "mlflow-server.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90) -> MlflowServer:
        self.store.parent.mkdir(parents=True, exist_ok=True)
        command = [
            # MLflow's server jobs (GenAI evaluation and trace rollups, two more processes) serve no training run and
            # hold up its stop by seconds.
            "env",
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false",
            *mlflow_command(),
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.store}",
            "--artifacts-destination",
            str(self.artifacts),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        ready = functools.partial(http_ok, f"{self.url}/health")
        self.process = launch(command, self.log_path, ready, f"mlflow server on {self.url}", timeout, detach=True)
        return self

    def stop(self) -> None:
        """SIGTERM to its process group (`mlflow server` runs uvicorn as a child), SIGKILL after 30 s; returns once
        every process of it has gone."""
        self._signal(signal.SIGTERM)
        if not self._gone(30):
            self.kill()

    def kill(self) -> None:
        """SIGKILL to the whole server at once: a server lost, as a test needs it."""
        self._signal(signal.SIGKILL)
        self._gone(30)

    def pause(self) -> None:
        """SIGSTOP to the whole server: it accepts connections (the kernel does) and answers none, as a server that
        hangs or a network that drops its answers; `resume` lets it go on."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)

    def _gone(self, timeout: float) -> bool:
        """Whether the server's process group emptied within `timeout` seconds."""
        if self.process is None:
            return True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.process.poll()  # reaps the leader, whose group then holds only what is left of it
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.05)
        return False


def show_store(runs_dir: str | Path, port: int = 5000) -> None:
    """`invoke obs.mlflow`: the UI over the embedded store until SIGINT or SIGTERM, then the server stopped."""
    import signal
    import threading

    from training.spec import EMBEDDED_STORE
    from trainkit.services.process import port_free

    store = Path(runs_dir) / EMBEDDED_STORE
    if not store.is_file():
        raise SpecError(
            f"--runs-dir {runs_dir}: no MLflow store there ({store}); a run with --track mlflow makes it "
            "(or give the runs folder the tracked runs went to)"
        )
    server = MlflowServer(store, port=port if port_free(port) else None)
    ended = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: ended.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        print(f"MLflow UI: {server.url} (store {store.resolve()}; log {server.log_path}); Ctrl-C stops it", flush=True)
        while not ended.wait(1.0):
            if server.process.poll() is not None:
                raise SpecError(f"the MLflow server exited (code {server.process.returncode}); see {server.log_path}")
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("MLflow UI stopped", flush=True)
