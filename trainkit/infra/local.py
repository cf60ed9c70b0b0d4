"""The local profile's `up` / `down`: the servers a local run can use (etcd for `--rdzv etcd`, Prometheus,
a GPU exporter where there is hardware), and a report of what this machine can run."""

from __future__ import annotations

import importlib.util

from trainkit.errors import SpecError
from trainkit.job.build import local_machine
from trainkit.services import LocalEtcd, LocalGpuExporter, LocalPrometheus


def up() -> str:
    """Start the local servers (a missing binary is reported, not fatal) and describe this machine."""
    here = local_machine()
    limit, what = here.process_limit, here.described
    torch_ok = importlib.util.find_spec("torch") is not None
    etcd = _start_local("etcd", LocalEtcd().up, "for --rdzv etcd; state in .trainkit/etcd")
    prometheus = LocalPrometheus()
    metrics = _start_local("prometheus", prometheus.up, "scrapes local ranks; state in .trainkit/prometheus")
    if prometheus.endpoint() is None:
        gpus = "not started: Prometheus is not running"
    else:
        served = LocalGpuExporter().serve(prometheus.root)
        gpus = (
            f"running on {served[0]} ({served[1]})"
            if served
            else "none: no NVIDIA GPU or EFA device (GPU panels: no data)"
        )
    return "\n".join(
        [
            "local profile: jobs run as processes on this machine; c10d rendezvous needs no server.",
            f"  capacity      {what} -> up to {limit} training process(es)",
            f"  torch         {'installed' if torch_ok else 'MISSING: run make setup'}",
            f"  etcd          {etcd}",
            f"  prometheus    {metrics}",
            f"  gpu exporter  {gpus}",
        ]
    )


def _start_local(name: str, start, what: str) -> str:
    """Start one local server; a missing binary is reported, not fatal (c10d training needs neither)."""
    try:
        endpoint, started = start()
    except SpecError as error:
        return f"not started: {error}"
    return f"{'started' if started else 'running'} on {endpoint} ({what})"


def down() -> str:
    stopped = [
        name
        for name, server in (
            ("etcd", LocalEtcd()),
            ("prometheus", LocalPrometheus()),
            ("gpu exporter", LocalGpuExporter()),
        )
        if server.down()
    ]
    servers = f"stopped {', '.join(stopped)}" if stopped else "no local servers were running"
    return f"local profile: {servers} (etcd data removed; Prometheus data kept); run outputs under runs/ are kept."
