"""The pre-commit hooks (.pre-commit-config.yaml) run offline over the whole tree and pass; the stale-pointer hook
fails on a planted wrong path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import REPO


def test_every_hook_passes_on_the_whole_tree(tmp_path):
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit")}  # its store, nothing fetched into it
    done = subprocess.run(
        [str(Path(sys.executable).parent / "pre-commit"), "run", "--all-files", "--show-diff-on-failure"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    hooks = ("ruff check", "ruff format", "terraform fmt", "hadolint", "stale pointers")
    assert all(f"{hook}" in done.stdout for hook in hooks), done.stdout


def test_the_pointer_hook_fails_on_a_planted_wrong_path(tmp_path):
    planted = REPO / "tests" / "helpers" / f"planted_{os.getpid()}.md"
    wrong = "/".join(("trainkit", "no", "such", "module.py"))  # not written whole here: this file is checked too
    planted.write_text(f"See {wrong}.\n")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.helpers.pointers"], cwd=REPO, capture_output=True, text=True, timeout=120
        )
    finally:
        planted.unlink()
    assert done.returncode == 1 and f"{planted.relative_to(REPO)}:1: {wrong}" in done.stdout
