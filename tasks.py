"""Invoke tasks: `invoke --list`. The tasks live in trainkit/cli/, one module per collection; an
installed trainkit offers the same commands as `trainkit ...` without this file."""

from trainkit.cli import namespace

__all__ = ["namespace"]
