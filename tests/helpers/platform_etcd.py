"""The platform's etcd as the EKS stand-in's pods meet it: the issuer (trainkit/backends/eks/etcd_issuer.py) against
the stand-in's API, the etcd pod the platform stack renders (tests/helpers/platform_stack.py, EtcdPod: TLS,
client certificates, its data on a volume of its own) run with the real etcd binary, and its Service's names resolving
on every pod to the network's gateway, relayed to it (tests/helpers/kube_api.py, FakeCluster.serve).

The issuer's first pass makes the CA and etcd's certificate (etcd mounts that Secret, so it starts after); then it
passes every PASS_S in a thread, as its Deployment does every few seconds.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.kube_api import FakeCluster
from tests.helpers.platform_stack import EtcdPod
from trainkit.backends.eks import cluster
from trainkit.backends.eks.etcd_issuer import Issuer, IssuerSettings
from trainkit.backends.eks.etcd_tls import Issued, utc_now
from trainkit.backends.eks.kube import Kube
from trainkit.run.torchrun import TLS_CA, TLS_CERT, TLS_KEY

PASS_S = 0.2


@dataclass
class PlatformEtcd:
    pod: EtcdPod
    issuer: Issuer
    log: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://{self.pod.endpoint}"

    @property
    def ca_cert(self) -> bytes:
        return self.issuer.ca.cert


def secret_files(fake: FakeCluster, namespace: str, name: str) -> dict[str, bytes]:
    return {key: value.encode() for key, value in fake.secrets[(namespace, name)].items()}


def identity_of(fake: FakeCluster, job: str) -> Issued:
    """The etcd identity the issuer wrote for `job` (its Secret in the jobs' namespace)."""
    files = secret_files(fake, cluster.JOBS_NAMESPACE, cluster.etcd_identity_secret(job))
    return Issued(files[TLS_CERT], files[TLS_KEY])


@contextlib.contextmanager
def platform_etcd(fake: FakeCluster, log_path: Path) -> Iterator[PlatformEtcd]:
    volume = Path(tempfile.mkdtemp(prefix="trainkit-etcd-", dir="/tmp"))  # etcd's user must reach it (tmp_path: 0700)
    volume.chmod(0o755)
    tls = volume.parent / f"{volume.name}-tls"
    pod = EtcdPod(volume, log_path, tls=tls)
    names = [*cluster.etcd_server_names(), "127.0.0.1"]  # and the address the issuer dials here
    lines: list[str] = []
    issuer = Issuer(Kube.connect(), IssuerSettings(f"https://{pod.endpoint}", server_names=names), log=lines.append)
    issuer.prepare(utc_now())
    tls.mkdir()
    for name, content in secret_files(fake, cluster.PLATFORM_NAMESPACE, cluster.ETCD_SERVER_SECRET).items():
        (tls / name).write_bytes(content)
    assert {TLS_CERT, TLS_KEY, TLS_CA} <= {p.name for p in tls.iterdir()}
    stop = threading.Event()
    try:
        pod.mount()
        pod.start_etcd()
        fake.serve(cluster.etcd_server_names(), cluster.ETCD_PORT, pod.port)
        issuer.pass_once()  # auth on before any job: no pass ever finds etcd open

        def passes() -> None:
            while not stop.wait(PASS_S):
                try:
                    issuer.pass_once()
                except Exception as error:  # as the Deployment: a failed pass is logged and retried
                    lines.append(f"pass failed: {type(error).__name__}: {error}")

        threading.Thread(target=passes, daemon=True).start()
        yield PlatformEtcd(pod, issuer, lines)
    finally:
        stop.set()
        pod.stop()
        shutil.rmtree(volume, ignore_errors=True)
        shutil.rmtree(tls, ignore_errors=True)
