"""What a test reads of an MLflow store (issue 54): the MLflow runs recorded for a trainkit run."""

from __future__ import annotations

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
