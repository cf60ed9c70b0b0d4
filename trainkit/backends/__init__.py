"""Job backends: where a prepared run executes. One small interface so EKS can sit beside local."""

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
