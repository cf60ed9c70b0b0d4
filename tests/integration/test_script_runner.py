"""The runner every rank starts a user's script through (`python -m training.script FILE ARGS`, training/script.py)
against `python FILE ARGS` itself, in real processes: what the script sees of itself, a class of its `__main__` sent
to a spawned process, its exit code and its atexit handlers; and a project whose own package is called `training`,
as trainkit's is, in the working directory or beside the script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from training.script import RUNNER_ENV

SELF = """
import atexit, json, multiprocessing, os, sys


class Point:
    def __init__(self, x):
        self.x = x


def double(point):
    return point.x * 2


if __name__ == "__main__":
    atexit.register(lambda: print("atexit ran", flush=True))
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # Point pickled by name from __main__
        doubled = pool.map(double, [Point(21)])
    seen = {"argv": sys.argv, "path0": sys.path[0], "name": __name__, "file": __file__, "doubled": doubled}
    seen["cwd_on_path"] = os.getcwd() in sys.path
    print(json.dumps(seen), flush=True)
    sys.exit(int(sys.argv[1]))
"""


def run(command: list[str], cwd: Path, runner: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "TRAINKIT_FAILURE_CHANNEL")}
    return subprocess.run(
        command, cwd=cwd, env={**env, **(RUNNER_ENV if runner else {})}, capture_output=True, text=True, timeout=120
    )


def observed(done: subprocess.CompletedProcess) -> dict:
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))


def test_a_script_sees_itself_as_under_python_file_and_ends_the_same_way(tmp_path):
    code, elsewhere = tmp_path / "code", tmp_path / "elsewhere"
    code.mkdir(), elsewhere.mkdir()
    (code / "me.py").write_text(SELF)
    plain = run([sys.executable, str(code / "me.py"), "0", "--x"], elsewhere, runner=False)
    runner = run([sys.executable, "-m", "training.script", str(code / "me.py"), "0", "--x"], elsewhere, runner=True)
    assert plain.returncode == runner.returncode == 0, runner.stderr[-2000:]
    assert (
        observed(runner)
        == observed(plain)
        == {
            "argv": [str(code / "me.py"), "0", "--x"],
            "path0": str(code),
            "name": "__main__",
            "file": str(code / "me.py"),
            "doubled": [42],
            "cwd_on_path": False,
        }
    )
    # a failing exit: its code, the handlers the script registered, and the one line trainkit adds
    failed = run([sys.executable, "-m", "training.script", str(code / "me.py"), "5"], elsewhere, runner=True)
    assert failed.returncode == 5 and "atexit ran" in failed.stdout, failed.stderr[-2000:]
    assert failed.stderr.strip().splitlines()[-1] == "error: rank 0: exited with code 5 (may be restarted)"


def test_a_project_with_its_own_training_package_runs_its_script(tmp_path):
    """trainkit's package is `training`; so may a user's be. In the working directory it does not hide trainkit's
    runner; beside the script it is the one the script imports, as under `python FILE`."""
    project = tmp_path / "project"
    for folder in (project / "training", project / "scripts" / "training"):
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("")
    (project / "training" / "script.py").write_text("raise SystemExit('the project package, not the runner')\n")
    (project / "scripts" / "training" / "models.py").write_text("NAME = 'the project model'\n")
    (project / "scripts" / "train.py").write_text("from training import models\nprint(models.NAME)\n")
    done = run([sys.executable, "-m", "training.script", "scripts/train.py"], project, runner=True)
    assert done.returncode == 0 and done.stdout.strip() == "the project model", done.stderr[-2000:]
