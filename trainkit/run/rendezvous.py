"""trainkit's rendezvous backends for torchrun: `trainkit-etcd` and `trainkit-c10d` (below).

`trainkit-etcd` is the etcd rendezvous that rides out an etcd restart: torch's dynamic rendezvous on etcd's v2 API,
with every store call retried for a while instead of failing at the first refused connection.

Measured on torch 2.13 (docs/elastic.md): with the stock `etcd-v2` backend, restarting
etcd for one second killed every agent of a running job — each agent polls the rendezvous state
every 0.1 s while its workers train, and the first `RendezvousConnectionError` ends the agent. The
workers themselves do not use etcd (they have their own TCP store), so the only thing that needs to
survive the outage is that poll. `PatientBackend` retries a failed read or write for up to
`store_outage_timeout` seconds (a `--rdzv-conf` key, default 60) with capped backoff; past that the
error is raised as before. A write is a compare-and-set, so retrying one whose answer was lost is
safe: it fails the comparison and the handler re-reads the state.

torchrun finds this backend through the `torchrun.handlers` entry point (pyproject.toml) under the
name `trainkit-etcd`, wherever trainkit is installed (this machine, the training image).

`trainkit-c10d` is torch's c10d rendezvous for jobs on this machine (the local backend), closed to other users:

- torch's c10d backend hosts its TCPStore with no bind address (torch 2.13
  torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py:156-162), so the store listens on every interface
  (`ss -ltn`: `*:port`) whatever the endpoint says. Here the host binds a socket to the endpoint's own address
  (127.0.0.1 for a local job) and hands it to TCPStore (`master_listen_fd`, torch/_C/_distributed_c10d.pyi:246).
- Every agent unpickles the rendezvous state it reads from the store (dynamic_rendezvous.py:444), and any process
  that reaches the store can list its keys (`list_keys`, _distributed_c10d.pyi:228) and overwrite the state, so a
  store open to other users of the machine runs their code in the job. `SignedBackend` seals the state with an
  HMAC keyed by `TRAINKIT_RDZV_KEY` (torchrun.py), a fresh secret in the agents' environment only (readable by
  their user alone); a state that fails the check is refused before it is unpickled (RendezvousStateError: the
  agent stops).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousStateError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, create_handler
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from trainkit.run.torchrun import LOCAL_RDZV_BACKENDS, RDZV_KEY_ENV, STORE_PREFIX

log = logging.getLogger(__name__)

BACKEND_NAME = "trainkit-etcd"
LOCAL_C10D = LOCAL_RDZV_BACKENDS["c10d"]
OUTAGE_TIMEOUT_S = 60.0
_BACKOFF_S = (0.2, 0.5, 1.0, 2.0)


class PatientBackend(RendezvousBackend):
    """Wraps a rendezvous backend; reads and writes wait out a store outage of up to `outage_timeout` s."""

    def __init__(
        self,
        inner: RendezvousBackend,
        outage_timeout: float,
        name: str = BACKEND_NAME,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._inner = inner
        self._name = name  # torch checks it against --rdzv-backend
        self._outage_timeout = outage_timeout
        self._clock = clock

    @property
    def name(self) -> str:
        return self._name

    def get_state(self):
        return self._retry(self._inner.get_state)

    def set_state(self, state: bytes, token: Any = None):
        return self._retry(lambda: self._inner.set_state(state, token))

    def _retry(self, call: Callable[[], Any]) -> Any:
        started = self._clock()
        attempt = 0
        while True:
            try:
                result = call()
            except RendezvousConnectionError:
                waited = self._clock() - started
                if waited >= self._outage_timeout:
                    raise
                if attempt == 0:
                    log.warning(
                        "rendezvous store unreachable; retrying for up to %.0f s (store_outage_timeout)",
                        self._outage_timeout,
                    )
                time.sleep(min(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)], self._outage_timeout - waited))
                attempt += 1
                continue
            if attempt:
                log.warning("rendezvous store reachable again after %.1f s", self._clock() - started)
            return result


def create_etcd_handler(params: RendezvousParameters) -> RendezvousHandler:
    from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.etcd_store import EtcdStore

    backend, shared = create_backend(params)  # TLS from the conf: protocol, ca_cert, ssl_cert, ssl_cert_key
    # torch keeps every job's store in one folder, /torch/elastic/store, and lists the whole folder on each wait
    # (etcd_store.py, _try_wait_get): each job's store gets a folder of its own, the only one its etcd role may
    # read (trainkit/backends/eks/etcd_tls.py, job_keys).
    store = EtcdStore(shared.client, f"{STORE_PREFIX}/{params.run_id}")
    timeout = float(params.get("store_outage_timeout", OUTAGE_TIMEOUT_S))
    patient = PatientBackend(backend, timeout, params.backend)
    # A local job's etcd (trainkit/services/etcd.py) listens on 127.0.0.1 without authentication, and its v2 API lists
    # every key to any user of the machine: the state is signed as trainkit-c10d's is, with the key trainkit gives
    # every local job. EKS pods have a key too (their submission's Secret), on top of their etcd identity.
    key = os.environ.get(RDZV_KEY_ENV, "")
    return create_handler(store, SignedBackend(patient, key.encode(), params.backend) if key else patient, params)


def etcd_handler() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The `torchrun.handlers` entry point: torch calls this and registers what it returns."""
    return create_etcd_handler


class SignedBackend(RendezvousBackend):
    """Wraps a rendezvous backend; the state is stored behind an HMAC-SHA256 of it under `key`, and a state read back
    whose HMAC does not match (written by someone without the key) is refused before torch unpickles it."""

    def __init__(self, inner: RendezvousBackend, key: bytes, name: str = LOCAL_C10D):
        self._inner = inner
        self._key = key
        self._name = name  # torch checks it against --rdzv-backend

    @property
    def name(self) -> str:
        return self._name

    def get_state(self):
        found = self._inner.get_state()
        return None if found is None else (self._open(found[0]), found[1])

    def set_state(self, state: bytes, token: Any = None):
        found = self._inner.set_state(self._seal(state), token)
        return None if found is None else (self._open(found[0]), *found[1:])

    def _seal(self, state: bytes) -> bytes:
        return hmac.new(self._key, state, hashlib.sha256).digest() + state

    def _open(self, sealed: bytes) -> bytes:
        size = hashlib.sha256().digest_size
        state = sealed[size:]
        if not hmac.compare_digest(sealed[:size], hmac.new(self._key, state, hashlib.sha256).digest()):
            raise RendezvousStateError(
                "the rendezvous state in the store is not signed with this job's key: another process wrote to the "
                "job's store; stopping rather than loading it"
            )
        return state


def _endpoint_store(params: RendezvousParameters) -> TCPStore:
    """The job's TCPStore: on the host, listening on the endpoint's own address only; elsewhere, a client of it."""
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
    is_host = params.get_as_bool("is_host")
    if is_host is None:
        raise ValueError(f"--rdzv-backend {LOCAL_C10D} needs is_host=true|false in --rdzv-conf (which node hosts it)")
    timeout = timedelta(seconds=params.get_as_int("read_timeout", 60))
    try:
        if not is_host:
            return TCPStore(host, port, is_master=False, multi_tenant=True, timeout=timeout)
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        listener = socket.create_server(address, family=family)
        # The store's server owns the descriptor from here and closes it (detach: Python must not close it too).
        return TCPStore(
            host, port, is_master=True, multi_tenant=True, timeout=timeout, master_listen_fd=listener.detach()
        )
    except (OSError, ValueError, RuntimeError, TimeoutError) as error:
        raise RendezvousConnectionError(f"the c10d store at {host}:{port} is not available ({error})") from error


def create_c10d_handler(params: RendezvousParameters) -> RendezvousHandler:
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    key = os.environ.get(RDZV_KEY_ENV, "")
    if not key:
        raise ValueError(
            f"--rdzv-backend {LOCAL_C10D} signs the rendezvous state with the key in {RDZV_KEY_ENV}, which this "
            "agent's environment lacks: start the job through trainkit (invoke train or invoke run), which sets it"
        )
    store = _endpoint_store(params)
    backend = SignedBackend(C10dRendezvousBackend(store, params.run_id), key.encode(), params.backend)
    return create_handler(store, backend, params)


def c10d_handler() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The `torchrun.handlers` entry point of `trainkit-c10d`."""
    return create_c10d_handler
