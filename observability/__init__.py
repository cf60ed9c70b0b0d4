"""Observability as code: the metric contract, Grafana dashboards, Prometheus alert rules, the local
GPU/EFA exporter, and the run report. `python -m observability.generate` writes `generated/`."""
