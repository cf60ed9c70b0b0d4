"""Local servers the product starts as processes: etcd for the etcd rendezvous, Prometheus (and a GPU
exporter where there is a GPU) for metrics.

Each comes in two shapes: a server owned by its caller (`EtcdServer`, `PrometheusServer`: tests, the
chaos harness) and the local profile's background server (`LocalEtcd`, `LocalPrometheus`,
`LocalGpuExporter`), which `make up` starts, outlives the command, keeps its pid, endpoint and log
under `.trainkit/<name>/` (`TRAINKIT_STATE_DIR` moves `.trainkit`) and `make down` stops.
"""

from trainkit.services.etcd import EtcdServer, LocalEtcd, etcd_healthy
from trainkit.services.gpu import LocalGpuExporter
from trainkit.services.process import free_port_pair, http_ok, port_free
from trainkit.services.prometheus import LocalPrometheus, PrometheusServer, write_targets

__all__ = [
    "EtcdServer",
    "LocalEtcd",
    "LocalGpuExporter",
    "LocalPrometheus",
    "PrometheusServer",
    "etcd_healthy",
    "free_port_pair",
    "http_ok",
    "port_free",
    "write_targets",
]
