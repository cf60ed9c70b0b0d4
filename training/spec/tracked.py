"""Experiment tracking (issue 54): an MLflow run per job, which records the spec, the metrics and the end state, so
runs can be compared across learning rates, models, data, targets and weeks. Prometheus and Grafana stay for
operations (is the job alive, are the GPUs busy); MLflow is the record of experiments."""

from __future__ import annotations

from dataclasses import dataclass

from training.spec.options import option

TRACKERS = ("mlflow",)
DEFAULT_EXPERIMENT = "trainkit"
EMBEDDED_STORE = "mlflow.db"
"""The embedded store's file in the runs folder: MLflow's own local backend, SQLite (MLflow's default since 3.7;
its file store is in maintenance mode and refused by default in 3.17), with nothing to start."""


@dataclass
class TrackingOptions:
    """Where the job's MLflow run goes. None of it changes what is trained: a run resumed with other values is the
    same run."""

    track: str | None = option(
        None,
        "Record the run in an experiment tracker: `mlflow` (default: none). Restarts continue the same MLflow run.",
        choices=TRACKERS,
        trains=False,
    )
    uri: str | None = option(
        None,
        "With --track mlflow: the tracking server, an http(s) URL, a SageMaker managed MLflow tracking server's ARN, "
        "or sqlite:///<file>; default: the embedded store in the runs folder (<runs-dir>/mlflow.db), which "
        "`invoke obs.mlflow` shows.",
        flag="tracking-uri",
        trains=False,
    )
    experiment: str | None = option(
        None,
        f"With --track: the MLflow experiment the run is recorded in (default: {DEFAULT_EXPERIMENT}); the MLflow "
        "run's name is the run id.",
        trains=False,
    )
    commit: str | None = option(
        None,
        "The trainkit commit that launched the job (the launcher sets it; the MLflow run's trainkit.commit tag).",
        trains=False,
        cli=False,
    )

    @property
    def enabled(self) -> bool:
        return self.track is not None

    @property
    def experiment_name(self) -> str:
        return self.experiment or DEFAULT_EXPERIMENT
