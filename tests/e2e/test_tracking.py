"""Experiment tracking with MLflow (issue 54) on real 2-process runs: MLflow's own client in the workers and the
launcher, its SQLite store and its server, the UI in a real browser (Debian's Chromium driven by Playwright)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
from pathlib import Path

from tests.helpers.paths import REPO
from tests.helpers.product import BIN, invoke, killed_after_checkpoint, output, read_jsonl, start_invoke, tiny_args
from tests.helpers.waiting import wait_for
from training.common.tracking import FLUSH_ENV, RUN_TAG, TRACKING_FILE
from trainkit.services.process import free_port_pair, http_ok

SECRET = "hf_trainkitTestTokenNeverLogged0123"
SCREENSHOT_ENV = "TRAINKIT_UPDATE_SCREENSHOT"
"""Set: the browser test's screenshot also replaces docs/images/mlflow-run.png, which docs/observability.md shows."""


def mlflow_runs(store: Path) -> tuple:
    """(a client of the store, every run in it)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    experiments = client.search_experiments()
    return client, [run for e in experiments for run in client.search_runs([e.experiment_id])]


def test_a_run_killed_and_resumed_is_one_mlflow_run_with_every_step_once_which_the_ui_shows(tmp_path):
    """The whole job SIGKILLed after its step-4 checkpoint (launcher, agents, workers: a lost machine), then the same
    command again: one MLflow run in the runs folder's embedded store, every step once with metrics.jsonl's value,
    FINISHED, with the spec as parameters (no secret), its tags and artifacts. Then `invoke obs.mlflow` shows it in
    headless Chromium: the run, its parameters and its loss chart."""
    runs = tmp_path / "runs"
    runs.mkdir()
    command = tiny_args(runs, "--steps", "8", "--checkpoint-interval", "4", "--track", "mlflow")
    command += ["--experiment", "lr-sweep", "--eval-fraction", "0.05", "--eval-interval", "4"]
    env = {"HF_TOKEN": SECRET}
    _, run_dir, resumed_from = killed_after_checkpoint(runs, 4, *command, env=env)
    assert 4 <= resumed_from < 8
    done = invoke(*command, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "tracking:" not in done.stdout + done.stderr, done.stdout[-2000:]  # nothing went unsent

    client, found = mlflow_runs(runs / "mlflow.db")
    (run,) = found
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    assert run.data.tags[RUN_TAG] == run_dir.name
    assert client.get_experiment(run.info.experiment_id).name == "lr-sweep"
    assert json.loads((run_dir / TRACKING_FILE).read_text())["run_id"] == run.info.run_id
    status = invoke("status", "--runs-dir", str(runs), "--run-id", run_dir.name, env=env).stdout
    assert f"  mlflow     run {run.info.run_id}, experiment {run.info.experiment_id}, the runs folder's store" in status
    records = read_jsonl(run_dir / "metrics.jsonl")
    for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in history) == list(range(1, 9)), (key, [m.step for m in history])
        assert {m.step: m.value for m in history} == {r["step"]: r[key] for r in records}, key
    evaluated = client.get_metric_history(run.info.run_id, "eval_loss")
    assert sorted(m.step for m in evaluated) == [4, 8]  # the evaluation issue's metrics too, each once
    spec = json.loads((run_dir / "spec.json").read_text())
    params = run.data.params
    assert params["optimisation.lr"] == json.dumps(spec["optimisation"]["lr"]) and params["model.name"] == "llama2-tiny"
    assert params["tracking.experiment"] == "lr-sweep"
    tags = run.data.tags
    assert tags["trainkit.target"] == "local" and tags["trainkit.model"] == "llama2-tiny" and tags["trainkit.commit"]
    assert tags["trainkit.export"] == str((run_dir / "model").resolve())
    assert not any(SECRET in value for value in [*params.values(), *tags.values()])
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == ["report.png", "summary.json"]

    port = free_port_pair()
    ui = subprocess.Popen(
        [str(BIN / "invoke"), "obs.mlflow", "--runs-dir", str(runs), "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/health"), 90, "MLflow's UI answering")
        page_of = f"http://127.0.0.1:{port}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
        shot = tmp_path / "mlflow-run.png"
        seen = browse(page_of, run_dir.name, shot)
    finally:
        ui.send_signal(signal.SIGINT)
        said, _ = ui.communicate(timeout=60)
    assert ui.returncode == 0 and f"MLflow UI: http://127.0.0.1:{port}" in said and "MLflow UI stopped" in said, said
    assert not http_ok(f"http://127.0.0.1:{port}/health")  # stopped: nothing answers there any more
    assert seen["name"] and seen["lr_param"] and seen["loss_traces"] >= 1, seen
    assert shot.stat().st_size > 10_000
    if os.environ.get(SCREENSHOT_ENV):
        shutil.copyfile(shot, REPO / "docs" / "images" / "mlflow-run.png")


def browse(page_of: str, name: str, shot: Path) -> dict:
    """The run's pages in headless Chromium: the overview (the run's name, the lr parameter), then its model
    metrics (the loss chart, its legend naming the run, drawn by the UI's plotting library: a trace in an SVG),
    screenshotted."""
    from playwright.sync_api import sync_playwright

    flags = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking"]
    flags += ["--disable-component-update", "--disable-sync"]
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=shutil.which("chromium"), args=flags)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(page_of)
            page.get_by_text("optimisation.lr").first.wait_for(timeout=60_000)
            seen = {"lr_param": page.get_by_text("optimisation.lr").count(), "name": page.get_by_text(name).count()}
            page.goto(page_of + "/model-metrics")
            page.wait_for_selector(".js-plotly-plot .trace", timeout=60_000)
            page.get_by_text(f"{name} (loss)", exact=True).wait_for(timeout=60_000)  # the loss chart's legend
            seen["loss_traces"] = page.locator(".js-plotly-plot .trace").count()  # a drawn line per chart
            page.screenshot(path=str(shot))
        finally:
            browser.close()
    return seen


def test_a_run_whose_tracking_server_stops_answering_finishes_says_what_was_not_sent_and_a_rerun_sends_it(
    tmp_path, mlflow_server
):
    """The session's real `mlflow server` (standing in for a team's or SageMaker's managed one) is frozen (SIGSTOP:
    it takes connections and answers none) while the run trains. The run finishes; the console warns once and ends
    saying what did not reach the server. With the server back, the same command finds the run finished and sends
    the steps the server lacks."""
    runs = tmp_path / "runs"
    command = tiny_args(runs, "--steps", "16", "--track", "mlflow", "--tracking-uri", mlflow_server.url)
    command += ["--run-id", "down", "--experiment", "down"]
    # the client's wait for an answer, 10 s by default in the workers (training/common/tracking.py CLIENT_ENV)
    process = start_invoke(*command, env={FLUSH_ENV: "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "1"})

    def logged_steps() -> list[int]:
        query = "SELECT DISTINCT step FROM metrics WHERE key = 'loss' AND run_uuid IN "
        query += "(SELECT run_uuid FROM runs WHERE name = 'down') ORDER BY step"
        with sqlite3.connect(mlflow_server.store) as db:
            return [row[0] for row in db.execute(query)]

    def status() -> str:
        with sqlite3.connect(mlflow_server.store) as db:
            return db.execute("SELECT status FROM runs WHERE name = 'down'").fetchone()[0]

    try:
        wait_for(lambda: len(logged_steps()) >= 3, 120, "the run's first steps on the server")
        mlflow_server.pause()
        assert process.wait(timeout=300) == 0, output(process)[-3000:]
    finally:
        mlflow_server.resume()
    said = output(process)
    warning = f"tracking: warning: MLflow at {mlflow_server.url} does not answer"
    assert said.count(warning) == 1, said[-3000:]
    assert f"tracking: not sent to MLflow at {mlflow_server.url} within 2 s: " in said, said[-3000:]
    assert "(metrics.jsonl keeps every step)" in said
    assert f"tracking: the MLflow run's end (FINISHED) was not recorded at {mlflow_server.url}" in said, said[-3000:]
    assert [r["step"] for r in read_jsonl(runs / "down" / "metrics.jsonl")] == list(range(1, 17))
    sent = logged_steps()
    assert 3 <= len(sent) < 16 and status() == "RUNNING"  # the end was never recorded: the server did not answer

    # The server answers again; the same command: the run is finished, and the store gets what it lacked.
    again = invoke(*command, timeout=300)
    assert again.returncode == 0 and "already finished at step 16" in again.stdout, again.stdout[-3000:]
    assert "tracking:" not in again.stdout + again.stderr, again.stdout[-3000:]
    assert logged_steps() == list(range(1, 17)) and status() == "FINISHED"
