"""The unit layer's guard (installed by tests/unit/conftest.py): starting a process fails, and says why."""

from __future__ import annotations

import subprocess


class ProcessInUnitTest(RuntimeError):
    """A unit test started a process."""


class RefusedPopen(subprocess.Popen):
    """Stands in for subprocess.Popen during a unit test (and so for subprocess.run, call, check_output and
    asyncio's subprocesses). A subclass, so isinstance() and subclassing keep working; refused in __new__,
    so no half-built Popen is left for its finaliser."""

    def __new__(cls, args, *rest, **kwargs):
        raise ProcessInUnitTest(
            f"a unit test started a process: {args!r}. tests/unit runs in-process only; a test that needs a "
            "process belongs in tests/integration (tools, servers, invoke commands) or tests/e2e (training)."
        )
