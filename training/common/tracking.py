"""The job's MLflow run (issue 54), from rank 0: its parameters and tags when it is made, then every logged step's
metrics, sent by a thread of its own so that training never waits on the tracking server.

One MLflow run per trainkit run, found again by its `trainkit.run_id` tag: a restart of any kind (elastic, stall,
kill -9, a spot interruption, the same command run again) continues it. What a restart redoes is not sent twice:
before the first send of a metric the run's history of it is read, and steps at or below the last one there are
dropped; the steps the run kept (metrics.jsonl up to the checkpoint it resumed from) that never reached the server
(it was down, or the process died with them queued) are sent first. The store keeps the first value it got for a
step; an exact resume repeats it bit for bit.

A server that does not answer never stops training: points wait in memory and are retried with a growing pause,
and the console says so once. At the end the wait to send what is left is bounded (FLUSH_S), then one line says what
was not sent; metrics.jsonl keeps every step regardless.

The end state (FINISHED, FAILED, KILLED with its one-line cause), the summary and the report are recorded by whoever
knows how the run ended (`end_run`: the launcher here, a job's node on a cluster), not by the workers.

MLflow's client library (mlflow-skinny: the tracking client without the server and UI) is imported only when a job
tracks, and only in the sending thread."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from training.spec import EMBEDDED_STORE, SUMMARY_FILE, Job

RUN_TAG = "trainkit.run_id"
CAUSE_TAG = "trainkit.cause"
EXPORT_TAG = "trainkit.export"
TAGS = {
    "trainkit.target": "the target it ran on",
    "trainkit.model": "the model",
    "trainkit.workload": "recipe, script, nccl-test, ...",
    "trainkit.commit": "the trainkit commit that launched it",
    "trainkit.image": "the training image (--image)",
    "trainkit.code_hash": "a script's code folder, runs/<id>/code/<hash>/",
}
TAG_NAMES = (RUN_TAG, CAUSE_TAG, EXPORT_TAG, *TAGS)
"""Every tag trainkit sets on an MLflow run (docs/tracking.md lists them)."""
ARTIFACTS_DIR = "mlartifacts"
"""Beside the embedded store in the runs folder: its experiments' artifacts, one folder each."""
TRACKING_FILE = "tracking.json"
"""The run folder's record of its MLflow run: {"uri", "experiment_id", "run_id"} (`invoke status` shows it)."""
FLUSH_ENV = "TRAINKIT_TRACKING_FLUSH_S"
FLUSH_S = 5.0
"""How long the end of a process waits for the points still queued (TRAINKIT_TRACKING_FLUSH_S overrides)."""


def flush_s(wait_s: float | None = None) -> float:
    """`wait_s`, else the environment's TRAINKIT_TRACKING_FLUSH_S, else FLUSH_S."""
    return float(os.environ.get(FLUSH_ENV, FLUSH_S)) if wait_s is None else wait_s


RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
NOT_METRICS = frozenset({"step", "time"})
MAX_PARAM_LENGTH = 6000
"""MLflow's limit on a parameter's value (mlflow/utils/validation.py MAX_PARAM_VAL_LENGTH)."""
BATCH_METRICS, BATCH_PARAMS = 1000, 100
"""What one log_batch call may carry (mlflow/utils/validation.py MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH)."""
CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
"""The REST client's own retries (7, with backoff: minutes) and timeout (120 s) would hold the sending thread long
after the server went; this module retries itself. A value already in the environment is kept."""


def store_uri(job: Job, run_dir: Path) -> str:
    """Where the job's MLflow run goes: --tracking-uri, else the embedded store beside the run folders."""
    if job.tracking.uri:
        return job.tracking.uri
    return "sqlite:///" + str(Path(run_dir).resolve().parent / EMBEDDED_STORE)


def shown_uri(uri: str) -> str:
    """The URI as a console line may show it (no credentials: validation refuses them, this is a second guard)."""
    scheme, sep, rest = uri.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else uri


def spec_params(spec: dict) -> dict[str, str]:
    """The validated spec, flattened to `section.field` -> text (MLflow parameters are strings). It holds no secret:
    tokens never enter the spec (trainkit/run/secrets.py)."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
            return
        text = value if isinstance(value, str) else json.dumps(value)
        flat[prefix] = text if len(text) <= MAX_PARAM_LENGTH else text[: MAX_PARAM_LENGTH - 3] + "..."

    walk("", spec)
    return flat


def record_metrics(record: dict) -> dict[str, float]:
    """A metrics.jsonl record's numbers, as MLflow metrics (flags, texts, nulls and non-finite values left out)."""
    return {
        key: float(value)
        for key, value in record.items()
        if key not in NOT_METRICS
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


def find_run(client, experiment_id: str, run_id: str):
    """The MLflow run recorded for trainkit's `run_id` in the experiment, or None."""
    found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{run_id}'", max_results=1)
    return found[0] if found else None


def experiment_id(client, name: str, uri: str) -> str:
    """The experiment's id, made when missing; in the embedded store its artifacts go beside it, in the runs folder
    (MLflow's SQLite store would put them under the creating process's working directory, ./mlruns)."""
    experiment = client.get_experiment_by_name(name)
    if experiment:
        return experiment.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        root = Path(uri.removeprefix("sqlite:///")).parent / ARTIFACTS_DIR
        location = (root / "".join(c if c.isalnum() or c in "-_." else "_" for c in name)).as_uri()
    return client.create_experiment(name, artifact_location=location)


def _client(uri: str):
    for name, value in CLIENT_ENV.items():
        os.environ.setdefault(name, value)
    import mlflow
    from mlflow.tracking import MlflowClient

    # sagemaker-mlflow 0.5.0 signs and routes a request by the process's global tracking URI, not the client's
    # (sagemaker_mlflow/auth_provider.py and mlflow_sagemaker_request_header_provider.py call
    # mlflow.get_tracking_uri()), and its header provider runs for every request: for an ARN the global URI must be
    # it; for any other it fails to parse one, which MLflow's header registry logs as a warning at every request.
    if uri.startswith("arn:"):
        mlflow.set_tracking_uri(uri)
    else:
        logging.getLogger("mlflow.tracking.request_header.registry").setLevel(logging.ERROR)
    return MlflowClient(tracking_uri=uri)


class Tracker:
    """Rank 0's MLflow run: `log` queues a step's metrics, `close` sends what is left within FLUSH_S."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        run_id: str,
        params: dict[str, str],
        tags: dict[str, str],
        run_dir: Path,
        backlog: Iterable[dict] = (),
        say: Callable[[str], None] = lambda line: print(line, flush=True),
    ):
        self.uri, self.experiment, self.run_id = uri, experiment, run_id
        self.params, self.tags, self.run_dir, self.say = params, tags, Path(run_dir), say
        self._pending: list[tuple[str, float, int, int]] = []  # (key, value, timestamp ms, step)
        for record in backlog:
            self._queue(record)
        self._cond = threading.Condition()
        self._closing = False
        self._client = None
        self.mlflow_run_id: str | None = None
        self._last: dict[str, int] = {}  # per key: the highest step the store holds
        self._resumed = False
        self._failed: str | None = None  # why the last attempt failed (None: the last one worked)
        self._thread = threading.Thread(target=self._loop, name="trainkit-tracking", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the training side

    def log(self, record: dict) -> None:
        with self._cond:
            self._queue(record)
            self._cond.notify()

    def _queue(self, record: dict) -> None:
        stamp, step = int(float(record.get("time", time.time())) * 1000), int(record["step"])
        self._pending.extend((key, value, stamp, step) for key, value in record_metrics(record).items())

    def close(self, wait_s: float | None = None) -> bool:
        """Send what is queued, waiting at most `wait_s` (FLUSH_S); True when everything reached the store, else
        one line says what did not."""
        wait_s = flush_s(wait_s)
        deadline = time.monotonic() + wait_s
        with self._cond:
            self._closing = True
            self._cond.notify()
            while (self._pending or self.mlflow_run_id is None) and time.monotonic() < deadline:
                self._cond.wait(timeout=max(0.0, deadline - time.monotonic()))
            left = list(self._pending)
            connected = self.mlflow_run_id is not None
        if connected and not left:
            return True
        steps = sorted({step for *_, step in left})
        what = f"{len(left)} metric point(s) of steps {steps[0]}-{steps[-1]}" if left else "no metric point"
        why = f": {self._failed}" if self._failed else ""
        run = "" if connected else ", and the MLflow run was never reached"
        self.say(
            f"tracking: not sent to MLflow at {shown_uri(self.uri)} within {wait_s:g} s: {what}{run}{why} "
            "(metrics.jsonl keeps every step)"
        )
        return False

    # ------------------------------------------------------------------ the sending thread

    def _loop(self) -> None:
        attempt = 0
        while True:
            with self._cond:
                while not self._pending and self.mlflow_run_id is not None and not self._closing:
                    self._cond.wait()
                if self._closing and not self._pending and self.mlflow_run_id is not None:
                    self._cond.notify_all()
                    return
                batch = list(self._pending[:BATCH_METRICS])
            try:
                if self.mlflow_run_id is None:
                    self._connect()
                self._send(batch)
            except Exception as error:  # whatever the client raises: the run goes on
                reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
                if self._failed is None and attempt == 0:
                    self.say(
                        f"tracking: warning: MLflow at {shown_uri(self.uri)} does not answer ({reason}); training "
                        "goes on, the metrics are kept and sent when it answers"
                    )
                self._failed = reason
                pause = RETRY_S[min(attempt, len(RETRY_S) - 1)]
                attempt += 1
                with self._cond:
                    if not self._closing:
                        self._cond.wait(timeout=pause)
                    else:  # closing: retry at once until close's deadline
                        self._cond.wait(timeout=min(pause, 0.5))
                continue
            with self._cond:
                del self._pending[: len(batch)]
                self._cond.notify_all()
            if self._failed is not None:
                self.say(f"tracking: MLflow at {shown_uri(self.uri)} answers again; the kept metrics were sent")
            self._failed, attempt = None, 0

    def _connect(self) -> None:
        if self._client is None:
            self._client = _client(self.uri)
        client = self._client
        experiment = experiment_id(client, self.experiment, self.uri)
        run = find_run(client, experiment, self.run_id)
        if run is None:
            run = client.create_run(experiment, run_name=self.run_id, tags={RUN_TAG: self.run_id, **self.tags})
            params = list(self.params.items())
            from mlflow.entities import Param

            for start in range(0, len(params), BATCH_PARAMS):
                chunk = [Param(key, value) for key, value in params[start : start + BATCH_PARAMS]]
                client.log_batch(run.info.run_id, params=chunk)
        else:  # a restart: the run goes on, its history decides what is sent
            self._resumed = True
            client.update_run(run.info.run_id, status="RUNNING")
        (self.run_dir / TRACKING_FILE).write_text(
            json.dumps({"uri": shown_uri(self.uri), "experiment_id": experiment, "run_id": run.info.run_id}) + "\n"
        )
        with self._cond:
            self.mlflow_run_id = run.info.run_id
            self._cond.notify_all()

    def _send(self, batch: list[tuple[str, float, int, int]]) -> None:
        if not batch:
            return
        from mlflow.entities import Metric

        client, run_id = self._client, self.mlflow_run_id
        if self._resumed:
            for key in {key for key, *_ in batch} - set(self._last):
                history = client.get_metric_history(run_id, key)
                self._last[key] = max((m.step for m in history), default=-1)
        points = [
            Metric(key, value, stamp, step) for key, value, stamp, step in batch if step > self._last.get(key, -1)
        ]
        if points:
            client.log_batch(run_id, metrics=points)
        for key, _, _, step in batch:
            self._last[key] = max(step, self._last.get(key, -1))


def open_tracker(job: Job, run_dir: Path, backlog: Iterable[dict] = ()) -> Tracker | None:
    """Rank 0's tracker for a job that tracks (None otherwise)."""
    if not job.tracking.enabled:
        return None
    values = {
        "trainkit.target": job.placement.target,
        "trainkit.model": job.model.name,
        "trainkit.workload": job.run.workload,
        "trainkit.commit": job.tracking.commit,
        "trainkit.image": job.placement.image,
        "trainkit.code_hash": _code_hash(run_dir),
    }
    tags = {key: str(value) for key, value in values.items() if value and key in TAGS}
    params = spec_params(job.to_dict())
    uri = store_uri(job, run_dir)
    return Tracker(uri, job.tracking.experiment_name, str(job.run.run_id), params, tags, run_dir, backlog)


def _code_hash(run_dir: Path) -> str | None:
    """A script workload's code folder name, runs/<id>/code/<hash>/ (trainkit/workloads/script.py)."""
    try:
        script = json.loads((Path(run_dir) / "workload.json").read_text()).get("script")
    except (OSError, ValueError):
        return None
    parts = Path(script).parts if script else ()
    return parts[parts.index("code") + 1] if "code" in parts[:-1] else None


def end_run(
    job: Job,
    run_dir: Path,
    status: str,
    cause: str | None = None,
    artifacts: Iterable[Path] = (),
    wait_s: float | None = None,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
) -> bool:
    """Record how the run ended in its MLflow run: `status` (FINISHED, FAILED, KILLED), the one-line `cause` (tag
    trainkit.cause), the export's location (tag trainkit.export, from summary.json) and `artifacts` (the summary, the
    report). Bounded like a tracker's close: past `wait_s` (FLUSH_S) one line says what was not recorded."""
    if not job.tracking.enabled:
        return True
    uri = store_uri(job, run_dir)
    wait_s = flush_s(wait_s)
    outcome: dict = {}

    def record() -> None:
        try:
            client = _client(uri)
            experiment = client.get_experiment_by_name(job.tracking.experiment_name)
            run = find_run(client, experiment.experiment_id, str(job.run.run_id)) if experiment else None
            if run is None:
                outcome["error"] = "no MLflow run was made for it (its processes never reached the store)"
                return
            mlflow_run = run.info.run_id
            if cause:
                client.set_tag(mlflow_run, CAUSE_TAG, cause[:5000])
            exported = _exported(run_dir)
            if exported:
                client.set_tag(mlflow_run, EXPORT_TAG, exported)
            for path in artifacts:
                if Path(path).is_file():
                    client.log_artifact(mlflow_run, str(path))
            client.set_terminated(mlflow_run, status)
            outcome["done"] = True
        except Exception as error:  # whatever the client raises: the run's end is not held up
            outcome["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]

    worker = threading.Thread(target=record, name="trainkit-tracking-end", daemon=True)
    worker.start()
    worker.join(wait_s)
    if outcome.get("done"):
        return True
    why = outcome.get("error") or f"no answer within {wait_s:g} s"
    say(f"tracking: the MLflow run's end ({status}) was not recorded at {shown_uri(uri)}: {why}")
    return False


def _exported(run_dir: Path) -> str | None:
    try:
        summary = json.loads((Path(run_dir) / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    exported = summary.get("hf_model_dir")
    return str(Path(exported).resolve()) if exported else None
