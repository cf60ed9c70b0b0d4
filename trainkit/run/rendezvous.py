"""The etcd rendezvous that rides out an etcd restart: torch's dynamic rendezvous on etcd's v2 API,
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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, create_handler

log = logging.getLogger(__name__)

BACKEND_NAME = "trainkit-etcd"
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

    backend, store = create_backend(params)
    timeout = float(params.get("store_outage_timeout", OUTAGE_TIMEOUT_S))
    return create_handler(store, PatientBackend(backend, timeout, params.backend), params)


def etcd_handler() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The `torchrun.handlers` entry point: torch calls this and registers what it returns."""
    return create_etcd_handler
