"""What a test reads of an MLflow store (issue 54): the MLflow runs recorded for a trainkit run; and a server that
takes only requests carrying its token."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from training.common.tracking import RUN_TAG


def tracked_runs(uri: str, run_id: str) -> tuple:
    """(a client of the store at `uri`, the MLflow runs tagged with trainkit's `run_id`, in every experiment)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client, list(client.search_runs(experiments, filter_string=f"tags.`{RUN_TAG}` = '{run_id}'"))


def steps_of(client, mlflow_run_id: str, key: str = "loss") -> list[int]:
    """The steps the store holds of `key`, sorted (a step twice shows twice)."""
    return sorted(m.step for m in client.get_metric_history(mlflow_run_id, key))


class TokenGate:
    """A team's MLflow server behind an authenticating proxy, as it is usually run (MLflow's own server checks no
    bearer token): each request on 127.0.0.1:`port` without `Authorization: Bearer <token>` gets 401, every other is
    passed to `upstream` and its answer back. `refused` counts the requests turned away."""

    def __init__(self, upstream: str, token: str):
        self.upstream, self.token, self.refused = upstream.rstrip("/"), token, 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> TokenGate:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _pass(self):
                if self.headers.get("Authorization") != f"Bearer {gate.token}":
                    gate.refused += 1
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                request = urllib.request.Request(gate.upstream + self.path, body, headers, method=self.command)
                try:
                    with urllib.request.urlopen(request, timeout=60) as answer:
                        status, kept, data = answer.status, answer.headers, answer.read()
                except urllib.error.HTTPError as error:
                    status, kept, data = error.code, error.headers, error.read()
                self.send_response(status)
                for key, value in kept.items():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _pass

        return Handler
