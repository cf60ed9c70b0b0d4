"""What the start-up benchmarks share (startup.py, restart.py): the trainkit checkout they time (this one, or
another with the same interpreter, its code first on the path, for a before/after), the machine they ran on, and
their results file, one record per checkout."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Checkout:
    repo: Path

    @classmethod
    def of(cls, checkout: str | None) -> Checkout:
        """`checkout`, or the one this module is in."""
        return cls(Path(checkout or Path(__file__).resolve().parents[2]).resolve())

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.repo)}

    def invoke(self, *args: str) -> list[str]:
        """`invoke ARGS` run by this checkout's tasks.py."""
        return [sys.executable, "-m", "invoke", "--search-root", str(self.repo), *args]

    def label(self) -> str:
        """Its short commit, `+changes` when its working tree differs from that commit."""
        git = ["git", "-C", str(self.repo)]
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        changed = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
        return commit + ("+changes" if changed.stdout else "")


def machine() -> dict[str, str]:
    return {
        "machine": f"{os.cpu_count()} cores, {platform.machine()}",
        "python": platform.python_version(),
        "measured": time.strftime("%Y-%m-%d"),
    }


def add_record(path: Path, key: str, record: dict) -> Path:
    """The results file with `record` under `key` (a checkout's earlier record of the same key replaced)."""
    existing = json.loads(path.read_text()) if path.is_file() else {}
    existing[key] = record
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(existing, indent=2) + "\n")
    return path
