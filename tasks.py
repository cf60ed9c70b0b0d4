"""Invoke tasks: `invoke --list`. The tasks live in trainkit/tasks/, one module per collection; an
installed trainkit offers the same commands as `trainkit ...` without this file."""

from trainkit.tasks import namespace

__all__ = ["namespace"]
