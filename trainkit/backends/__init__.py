"""Job backends: where a run executes.

local: `LocalBackend.submit(prepared run)` runs torchrun here and returns the job's exit code.
eks (`trainkit.backends.eks`): `submit(spec)`, `status`, `logs`, `stop` over the Kubernetes API; the
run is prepared inside the pods, so it takes the spec rather than a prepared run.
"""

from __future__ import annotations

from typing import Protocol

from ..launch import PreparedRun


class Backend(Protocol):
    def submit(self, run: PreparedRun) -> int:
        """Start the job; returns the job's exit code for foreground backends."""
        ...


def get_backend(target: str) -> Backend:
    from .local import LocalBackend

    backends = {"local": LocalBackend}
    return backends[target]()
