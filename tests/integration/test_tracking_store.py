"""training/common/tracking.py against MLflow's own client and SQLite store (issue 54): a restarted tracker continues
the same MLflow run and sends no step twice, the steps a run kept but never sent are sent first, a store that does
not answer costs one warning and a bounded wait, and the end state is recorded with its cause."""

from __future__ import annotations

import pytest

from training.common.tracking import CAUSE_TAG, RUN_TAG, Tracker, end_run
from trainkit.job import build

pytestmark = pytest.mark.integration


def records(steps, scale: float = 1.0) -> list[dict]:
    return [{"step": s, "time": 1_700_000_000 + s, "loss": scale / s, "warmup": s == 1} for s in steps]


def tracker(uri: str, run_dir, backlog=(), said=None) -> Tracker:
    say = said.append if said is not None else (lambda line: None)
    return Tracker(
        uri, "exp", "run-1", {"optimisation.lr": "0.002"}, {"trainkit.target": "local"}, run_dir, backlog, say
    )


def test_restarts_continue_one_run_and_no_step_is_sent_twice(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run-1"
    run_dir.mkdir()
    first = tracker(uri, run_dir)
    for record in records(range(1, 6)):
        first.log(record)
    assert first.close(wait_s=30)
    # The second process resumed from a step-3 checkpoint: it redoes 4 and 5 (other values here) and goes on.
    second = tracker(uri, run_dir, backlog=records(range(1, 4)))
    for record in records(range(4, 8), scale=2.0):
        second.log(record)
    assert second.close(wait_s=30)
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert run.data.tags[RUN_TAG] == "run-1" and run.data.params == {"optimisation.lr": "0.002"}
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")}
    assert len(client.get_metric_history(run.info.run_id, "loss")) == 7
    assert history == {1: 1.0, 2: 0.5, 3: 1 / 3, 4: 0.25, 5: 0.2, 6: 2 / 6, 7: 2 / 7}  # the first value of a step
    assert "warmup" not in run.data.metrics

    # A third whose backlog holds steps the store never got (its process died with them queued): sent first.
    third = tracker(uri, run_dir, backlog=records(range(1, 10)))
    assert third.close(wait_s=30)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == list(range(1, 10))

    job = build({"track": "mlflow", "experiment": "exp", "run_id": "run-1", "runs_dir": str(tmp_path)})
    assert end_run(job, run_dir, "FAILED", "rank 1 failed: DataError: no records", wait_s=30)
    ended = client.get_run(run.info.run_id)
    assert ended.info.status == "FAILED" and ended.data.tags[CAUSE_TAG] == "rank 1 failed: DataError: no records"


def test_a_store_that_does_not_answer_costs_one_warning_and_a_bounded_wait(tmp_path):
    said: list[str] = []
    silent = tracker("http://127.0.0.1:9", tmp_path, said=said)
    for record in records(range(1, 4)):
        silent.log(record)
    assert not silent.close(wait_s=1.5)
    warnings = [line for line in said if line.startswith("tracking: warning: MLflow at http://127.0.0.1:9 ")]
    assert len(warnings) == 1, said
    assert said[-1].startswith(
        "tracking: not sent to MLflow at http://127.0.0.1:9 within 1.5 s: 3 metric point(s) "
        "of steps 1-3, and the MLflow run was never reached: "
    ), said
    job = build({"track": "mlflow", "tracking_uri": "http://127.0.0.1:9", "run_id": "run-1"})
    ended: list[str] = []
    assert not end_run(job, tmp_path, "FINISHED", wait_s=1.5, say=ended.append)
    assert ended and ended[0].startswith("tracking: the MLflow run's end (FINISHED) was not recorded at "), ended
