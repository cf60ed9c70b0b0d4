"""Dashboards and alert rules as code: generated files are current, rules pass promtool, every alert
has a unit test that fires it, every query names a metric of the contract, GPU panels say "no data"."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from observability import generate, rules
from observability.contract import GPU_METRICS, known_metrics
from observability.dashboards import DASHBOARDS
from observability.dashboards.common import GPU_NO_DATA, expand, panel_queries, variable_queries

OBS = Path(generate.__file__).resolve().parent
RULES_FILE = OBS / "generated" / "rules" / "trainkit-alerts.rules.yaml"
UNIT_TESTS = OBS / "tests" / "alerts.test.yaml"
METRIC_NAME = re.compile(r"\b(trainkit_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+)\b")


def promtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing: run `make test-services` (Debian's prometheus package)")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


def test_regenerating_changes_nothing():
    assert generate.stale() == [], "run `invoke obs.generate` and commit observability/generated/"


def test_the_check_notices_an_edited_or_stray_file(tmp_path):
    generate.write(tmp_path)
    assert generate.stale(tmp_path) == []
    edited = tmp_path / "dashboards" / "training-run.json"
    edited.write_text(edited.read_text().replace("Loss", "Los"))
    (tmp_path / "dashboards" / "old.json").write_text("{}")
    assert generate.stale(tmp_path) == ["dashboards/old.json", "dashboards/training-run.json"]
    generate.write(tmp_path)
    assert generate.stale(tmp_path) == [] and not (tmp_path / "dashboards" / "old.json").exists()


def test_promtool_check_rules_passes():
    result = promtool("check", "rules", str(RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules.alerts())} rules found" in result.stdout


def test_promtool_unit_tests_pass():
    result = promtool("test", "rules", str(UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_would_catch_a_broken_rule(tmp_path):
    """The unit tests are not vacuous: with the NaN check removed, the loss test fails."""
    groups = rules.rule_groups()
    for group in groups["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == "TrainingLossNotFinite":
                rule["expr"] = "count by (run_id, model) (abs(trainkit_train_loss) == Inf) > 0"
    broken = tmp_path / "generated" / "rules" / RULES_FILE.name
    broken.parent.mkdir(parents=True)
    broken.write_text(yaml.safe_dump(groups))
    (tmp_path / "tests").mkdir()
    shutil.copy(UNIT_TESTS, tmp_path / "tests" / UNIT_TESTS.name)
    result = promtool("test", "rules", str(tmp_path / "tests" / UNIT_TESTS.name))
    assert result.returncode != 0 and "alertname: TrainingLossNotFinite" in result.stdout + result.stderr


def test_every_alert_has_a_unit_test_that_fires_it():
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fired = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    quiet = {case["alertname"] for test in tests for case in test["alert_rule_test"] if not case["exp_alerts"]}
    names = {alert.name for alert in rules.alerts()}
    assert fired == names and quiet == names, "each alert needs a firing case and a quiet case"


def test_prometheus_rule_carries_the_same_groups():
    rule = yaml.safe_load((RULES_FILE.parent / "trainkit-alerts.prometheusrule.yaml").read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"] == yaml.safe_load(RULES_FILE.read_text())


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_query_names_metrics_of_the_contract(name):
    board = generate.load_dashboard(name)
    queries = panel_queries(board) + variable_queries(board)
    assert len(queries) >= 8
    unknown = {m for _, expr in queries for m in METRIC_NAME.findall(expr)} - known_metrics()
    assert not unknown, f"{name}: queries use metrics nobody exports: {sorted(unknown)}"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for _, expr in queries:
        expand(expr, {"run_id": "r", "hostname": ".*"})  # every variable used is one the dashboard defines


def test_gpu_panels_show_no_data_rather_than_a_value():
    board = generate.load_dashboard("gpu-fleet.json")
    for panel in board["panels"]:
        if panel["type"] == "timeseries" and any("DCGM_" in t["expr"] for t in panel["targets"]):
            assert panel["fieldConfig"]["defaults"]["noValue"] == GPU_NO_DATA
    used = {m for _, expr in panel_queries(board) for m in METRIC_NAME.findall(expr)}
    required = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_SM_CLOCK"}
    required |= {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED"}
    assert required <= used <= set(GPU_METRICS) | known_metrics()
