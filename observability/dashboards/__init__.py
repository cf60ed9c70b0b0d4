"""Grafana dashboards built with grafana-foundation-sdk: `gpu_fleet` and `training_run`.

`DASHBOARDS` maps each generated file name to the function that builds it; `observability.generate`
writes them to `observability/generated/dashboards/`.
"""

from __future__ import annotations

from . import gpu_fleet, training_run

DASHBOARDS = {
    "gpu-fleet.json": gpu_fleet.build,
    "training-run.json": training_run.build,
}
