"""Every dashboard query and alert expression against a real Prometheus scraping a real 2-process run.

The local profile's own path: `invoke infra.up` starts Prometheus (scrape interval 1 s here), `invoke
train` registers the ranks as scrape targets, and afterwards each PromQL expression is asked of that
Prometheus at a moment during the run. Training panels must return data that matches metrics.jsonl;
GPU panels must be valid PromQL and, on a machine without a GPU exporter, return nothing at all.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
import urllib.request

import pytest

from observability import generate, rules
from observability.dashboards.common import expand, panel_queries, variable_queries
from tests.helpers.product import invoke, read_jsonl
from trainkit.services import LocalGpuExporter, free_port_pair

RUN_ID = "obs-live"


def ask(endpoint: str, expr: str, at: float) -> list[dict]:
    url = f"http://{endpoint}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            body = json.load(answer)
    except urllib.error.HTTPError as error:  # 400 bad_data: the expression does not parse or evaluate
        pytest.fail(f"{expr!r}: {error.read().decode()}")
    assert body["status"] == "success", body
    return body["data"]["result"]


def values(result: list[dict]) -> list[float]:
    return [float(sample["value"][1]) for sample in result]


@pytest.fixture(scope="module")
def scraped_run(tmp_path_factory):
    """(Prometheus endpoint, a time during the run, the run's records); the servers stop afterwards."""
    tmp = tmp_path_factory.mktemp("obs")
    env = {"TRAINKIT_STATE_DIR": str(tmp / "state"), "TRAINKIT_SCRAPE_INTERVAL": "1s"}
    up = invoke("infra.up", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    endpoint = re.search(r"prometheus +started on (\S+)", up.stdout).group(1)
    try:
        flags = ["--nproc", "2", "--steps", "40", "--checkpoint-interval", "10", "--peak-tflops", "0.5"]
        flags += ["--eval-fraction", "0.1"]  # the Loss panel's held-out series: evaluated at each checkpoint
        flags += ["--metrics-port", str(free_port_pair()), "--run-id", RUN_ID, "--runs-dir", str(tmp / "runs")]
        trained = invoke("train", *flags, env=env)
        assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-2000:]
        records = read_jsonl(tmp / "runs" / RUN_ID / "metrics.jsonl")
        # A moment while every rank was still up and had been scraped a few times.
        yield endpoint, records[-1]["time"] - 1.0, records
    finally:
        down = invoke("infra.down", env=env)
        assert "prometheus" in down.stdout, down.stdout + down.stderr


def test_prometheus_scraped_both_ranks_of_the_run(scraped_run):
    endpoint, at, _ = scraped_run
    per_rank = ask(endpoint, f'count_over_time(trainkit_train_step{{run_id="{RUN_ID}"}}[1m])', at)
    assert sorted(s["metric"]["rank"] for s in per_rank) == ["0", "1"]
    assert min(values(per_rank)) >= 3, "at least three scrapes of each rank during the run"


def test_every_training_panel_returns_data_that_matches_the_run(scraped_run):
    endpoint, at, records = scraped_run
    board = generate.load_dashboard("training-run.json")
    for variable, expr in variable_queries(board):
        assert RUN_ID in {s["metric"][variable] for s in ask(endpoint, expr, at)}
    for title, expr in panel_queries(board):
        result = ask(endpoint, expand(expr, {"run_id": RUN_ID}), at)
        assert result and all(math.isfinite(v) for v in values(result)), f"panel {title!r}: no data from {expr!r}"
    loss = values(ask(endpoint, expand(panel_expr(board, "Loss"), {"run_id": RUN_ID}), at))
    assert loss[0] in {r["loss"] for r in records}, "the loss panel shows a loss the run logged"
    held_out = next(expr for panel, expr in panel_queries(board) if panel == "Loss" and "eval" in expr)
    evaluated = values(ask(endpoint, expand(held_out, {"run_id": RUN_ID}), at))
    assert evaluated[0] in {r["eval_loss"] for r in records if "eval_loss" in r}, "and a held-out loss it logged"
    assert values(ask(endpoint, expand(panel_expr(board, "Restarts"), {"run_id": RUN_ID}), at)) == [0.0]
    since = values(ask(endpoint, expand(panel_expr(board, "Since last step"), {"run_id": RUN_ID}), at))
    assert 0 <= since[0] < 30


def panel_expr(board: dict, title: str) -> str:
    return next(expr for panel, expr in panel_queries(board) if panel == title)


def test_gpu_panels_parse_and_show_nothing_without_a_gpu_exporter(scraped_run):
    endpoint, at, _ = scraped_run
    board = generate.load_dashboard("gpu-fleet.json")
    no_hardware = LocalGpuExporter.hardware() is None
    for _, expr in variable_queries(board) + panel_queries(board):
        result = ask(endpoint, expand(expr, {"Hostname": ".*"}), at)
        if no_hardware:
            # count() of nothing is nothing in PromQL, so even the "GPUs reporting" stat stays empty.
            assert result == [], f"{expr!r} returned {result} on a machine with no GPU exporter"


def test_every_alert_rule_evaluates_and_a_healthy_run_fires_none(scraped_run):
    endpoint, at, _ = scraped_run
    for alert in rules.alerts():
        assert ask(endpoint, alert.expr, at) == [], f"{alert.name} fires on a healthy run"
    with urllib.request.urlopen(f"http://{endpoint}/api/v1/rules", timeout=30) as answer:
        loaded = [rule for group in json.load(answer)["data"]["groups"] for rule in group["rules"]]
    assert sorted(r["name"] for r in loaded) == sorted(a.name for a in rules.alerts())
    assert all(r["health"] == "ok" and not r.get("lastError") for r in loaded), loaded
