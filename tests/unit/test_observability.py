"""Dashboards and alert rules as code: generated files are current, every alert has a unit test that fires
it, every query and rule names a metric of the contract, the idle guard's alert watches the CronJob the platform
stack creates, GPU panels say "no data". The rules through promtool:
tests/integration/test_observability_promtool.py."""

from __future__ import annotations

import re

import pytest
import yaml

from observability import generate, rules
from observability.contract import GPU_METRICS, known_metrics
from observability.dashboards import DASHBOARDS
from observability.dashboards.common import GPU_NO_DATA, expand, panel_queries, variable_queries
from tests.helpers.observability_files import RULES_FILE, UNIT_TESTS
from tests.helpers.platform_stack import RESOURCES, ROOT, base_context, manifests, selected, unquote
from trainkit.backends.eks import cluster

METRIC_NAME = re.compile(r"\b(trainkit_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+|kube_[a-z0-9_]+)\b")


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


def test_every_rule_names_metrics_of_the_contract():
    named = {alert.name: set(METRIC_NAME.findall(alert.expr)) for alert in rules.alerts()}
    assert all(named.values()), f"rules whose metric the pattern does not see: {named}"
    unknown = {name: metrics - known_metrics() for name, metrics in named.items() if metrics - known_metrics()}
    assert not unknown, f"rules use metrics nobody exports: {unknown}"


def test_the_idle_guard_alert_watches_the_cronjob_the_platform_stack_creates():
    """IdleGuardFailing reads kube-state-metrics' series of the guard's CronJob: that chart is on in the platform's
    kube-prometheus-stack (the pinned release the contract cites), the CronJob carries the name the alert selects,
    and it runs on the schedule the alert's threshold and text assume, with no retry inside a run."""
    chart = base_context()["local"]["monitoring_charts"]["kube-prometheus-stack"]
    assert chart["version"] == "88.5.3", "re-read kube-state-metrics' names at the new pin (observability/contract.py)"
    values = yaml.safe_load((ROOT / "values" / "kube-prometheus-stack.yaml").read_text())
    assert values.get("kubeStateMetrics", {}).get("enabled", True) is not False
    assert "collectors" not in values.get("kube-state-metrics", {})  # the chart's default list has cronjobs
    (guard,) = [o for _, o in manifests() if o["kind"] == "CronJob"]
    assert guard["metadata"]["name"] == rules.IDLE_GUARD_CRONJOB == cluster.IDLE_GUARD
    assert f'cronjob="{rules.IDLE_GUARD_CRONJOB}"' in next(
        a.expr for a in rules.alerts() if a.name == "IdleGuardFailing"
    )
    assert guard["spec"]["schedule"] == f"*/{rules.IDLE_GUARD_EVERY_MINUTES} * * * *"
    assert guard["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 0


def test_the_gpu_telemetry_alerts_point_at_what_the_platform_stack_installs():
    """GpuUtilisationMissing and GpuPodUnschedulable read kube-state-metrics' nodes and pods collectors (the
    subchart's default list, not overridden) and dcgm-exporter's series; the first names dcgm-exporter's pods and
    ServiceMonitor as the release makes them (release named after the chart, no name override, ServiceMonitor on).
    A GPU pod waits as long as the idle guard's suggested window before it is reported."""
    values = yaml.safe_load((ROOT / "values" / "kube-prometheus-stack.yaml").read_text())
    assert "collectors" not in values.get("kube-state-metrics", {})
    release = RESOURCES[("helm_release", "monitoring")]
    assert "dcgm-exporter" in selected(release, base_context()) and unquote(release["name"]) == "${each.key}"
    exporter = yaml.safe_load((ROOT / "values" / "dcgm-exporter.yaml").read_text())
    assert exporter["serviceMonitor"]["enabled"] is True
    assert "nameOverride" not in exporter and "fullnameOverride" not in exporter
    missing = next(a for a in rules.alerts() if a.name == "GpuUtilisationMissing")
    assert f"kubectl -n {cluster.MONITORING_NAMESPACE} get pods -o wide -l app.kubernetes.io/name=dcgm-exporter" in (
        missing.description
    )
    assert f"kubectl -n {cluster.MONITORING_NAMESPACE} get servicemonitor dcgm-exporter" in missing.description
    assert rules.GPU_POD_UNSCHEDULABLE_FOR == rules.GPU_IDLE_FOR == "30m"


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
        expand(expr, {"run_id": "r", "Hostname": ".*"})  # every variable used is one the dashboard defines


def test_gpu_panels_show_no_data_rather_than_a_value():
    board = generate.load_dashboard("gpu-fleet.json")
    for panel in board["panels"]:
        if panel["type"] == "timeseries" and any("DCGM_" in t["expr"] for t in panel["targets"]):
            assert panel["fieldConfig"]["defaults"]["noValue"] == GPU_NO_DATA
    used = {m for _, expr in panel_queries(board) for m in METRIC_NAME.findall(expr)}
    required = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_SM_CLOCK"}
    required |= {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED"}
    assert required <= used <= set(GPU_METRICS) | known_metrics()
