"""Shared pieces of the dashboards: data source, panel builders, layout, and reading queries back.

Every panel queries the Prometheus data source chosen in the dashboard's `datasource` variable, so the
same JSON works in kube-prometheus-stack's Grafana and in any Grafana pointed at the local Prometheus.
"""

from __future__ import annotations

import json
import re

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
FULL_WIDTH = 24
GPU_NO_DATA = "no data: no GPU exporter reports on this selection"


def query(expr: str, legend: str | None = None, instant: bool = False) -> prometheus.Dataquery:
    target = prometheus.Dataquery().expr(expr).datasource(DATASOURCE)
    if legend is not None:
        target.legend_format(legend)
    if instant:
        target.instant().format(PromQueryFormat.TABLE)
    return target


def _targets(panel, queries: list[prometheus.Dataquery]):
    for ref, target in zip("ABCDEFGH", queries, strict=False):
        panel.with_target(target.ref_id(ref))
    return panel


def timeseries_panel(
    title: str, description: str, unit: str, queries: list, width: int = 12, no_value: str | None = None
) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
    panel.span(width).height(8)
    if no_value:
        panel.no_value(no_value)
    return _targets(panel, queries)


def stat_panel(title: str, description: str, unit: str, queries: list, width: int = 6) -> stat.Panel:
    panel = stat.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
    return _targets(panel.span(width).height(4), queries)


def table_panel(title: str, description: str, queries: list, no_value: str, width: int = FULL_WIDTH) -> table.Panel:
    panel = table.Panel().title(title).description(description).datasource(DATASOURCE).no_value(no_value)
    return _targets(panel.span(width).height(8), queries)


def query_variable(name: str, label: str, metric: str, multi: bool = False) -> dashboard.QueryVariable:
    variable = dashboard.QueryVariable(name).label(label).datasource(DATASOURCE)
    variable.query(f"label_values({metric}, {name})").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
    if multi:
        variable.multi(True).include_all(True).all_value(".*")
    return variable


def build_dashboard(
    title: str, uid: str, description: str, variables: list, rows: list[tuple[str, list]]
) -> dashboard.Dashboard:
    """A dashboard of titled rows; panel ids are assigned in order so the JSON is stable."""
    board = dashboard.Dashboard(title).uid(uid).description(description).tags(["trainkit"])
    board.refresh("30s").time("now-1h", "now").timezone("browser")
    board.with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    for variable in variables:
        board.with_variable(variable)
    panel_id = 0
    for row_title, panels in rows:
        panel_id += 1
        board.with_row(dashboard.Row(row_title).id(panel_id))
        for panel in panels:
            panel_id += 1
            board.with_panel(panel.id(panel_id))
    return board


def to_json(board: dashboard.Dashboard) -> str:
    return json.dumps(board.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------- reading generated dashboards back

_LABEL_VALUES = re.compile(r"^label_values\((?P<metric>[^,]+),\s*(?P<label>\w+)\)$")


def panel_queries(board: dict) -> list[tuple[str, str]]:
    """(panel title, expression) for every target of every panel."""
    found = []
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                found.append((inner["title"], target["expr"]))
    return found


def variable_queries(board: dict) -> list[tuple[str, str]]:
    """(variable name, PromQL) for each query variable: Grafana's `label_values(m, l)` is asked as
    `group by (l) (m)`, which returns the same label values from Prometheus."""
    found = []
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            match = _LABEL_VALUES.match(variable["query"])
            if match is None:
                raise ValueError(f"variable {variable['name']}: unsupported query {variable['query']!r}")
            found.append((variable["name"], f"group by ({match['label']}) ({match['metric']})"))
    return found


def expand(expr: str, values: dict[str, str], rate_interval: str = "1m") -> str:
    """Substitute Grafana's variables the way Grafana does before it sends a query."""
    expr = expr.replace("$__rate_interval", rate_interval)
    for name, value in sorted(values.items(), key=lambda item: -len(item[0])):
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    if "$" in expr:
        raise ValueError(f"unexpanded variable in {expr!r}")
    return expr
