"""trainkit installed as a package (not editable), run from another folder: the commands a user of the
training image or of a wheel runs work, and nothing is read from the source tree.

The package is built from a copy of the checkout (so the build cannot lean on the tree either) into a
--target folder; each command runs from an empty folder under an audit hook that records every file
opened below the checkout (imports included: io.open_code raises the same "open" event).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import BIN, REPO

DRIVER = """
import os, sys
repo = sys.argv[1]
interpreter = {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
opened = []
def audit(event, args):
    if event == "open" and isinstance(args[0], (str, bytes)):
        path = os.path.abspath(os.fsdecode(args[0]))
        if path.startswith(repo + os.sep) and not any(os.path.realpath(path).startswith(p) for p in interpreter):
            opened.append(path)
sys.addaudithook(audit)
import atexit, json
import observability, trainkit, training
modules = {m.__name__: m.__file__ for m in (trainkit, training, observability)}
atexit.register(lambda: print("AUDIT " + json.dumps({"opened": opened, "modules": modules}), file=sys.stderr))
sys.argv = ["trainkit", *sys.argv[2:]]
from trainkit.cli import main
main()
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """`pip install --no-deps .` of a copy of the checkout into a folder of its own."""
    root = tmp_path_factory.mktemp("installed")
    source, target = root / "source", root / "site"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (os.fsdecode(n) for n in listed)):
        origin = REPO / name
        if not origin.is_symlink() and not origin.is_file():
            continue  # deleted in the work tree, not yet committed
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(origin, source / name, follow_symlinks=False)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*command, "--target", str(target), str(source)], check=True, capture_output=True, timeout=600)
    shutil.rmtree(source)
    return target


def _run(installed: Path, cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINKIT_")}
    env["PYTHONPATH"] = str(installed)
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, str(REPO), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    audit = next(line for line in result.stderr.splitlines() if line.startswith("AUDIT "))
    return result, json.loads(audit.removeprefix("AUDIT "))


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--list"], "train"),
        (["plan", "--model", "llama2-70b", "--nodes", "16"], "Plan: llama2-70b on 16 x p5.48xlarge (128 GPUs)"),
        (["train", "--model", "llama2-7b", "--profile", "aws", "--dry-run"], "kind: PyTorchJob"),
        (["train", "--model", "llama2-tiny", "--dry-run"], '"name": "llama2-tiny"'),
    ],
    ids=["list", "plan-70b", "eks-dry-run", "local-dry-run"],
)
def test_installed_package_runs_from_another_folder(installed, tmp_path, args, expected):
    result, audit = _run(installed, tmp_path, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert expected in result.stdout, result.stdout[-3000:]
    for name, path in audit["modules"].items():
        assert Path(path).is_relative_to(installed), f"{name} imported from {path}, not the installed package"
    assert audit["opened"] == [], f"read from the source tree: {audit['opened'][:5]}"
    assert not any(tmp_path.iterdir()), "a dry run or a plan created files in the folder it ran from"


def test_console_entry_point_is_installed(installed, tmp_path):
    """The wheel's console script `trainkit` lists the same commands as `invoke --list` in the checkout."""
    script = installed / "bin" / "trainkit"
    env = {**os.environ, "PYTHONPATH": str(installed)}
    listed = subprocess.run([str(script), "--list"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    in_checkout = subprocess.run([str(BIN / "invoke"), "--list"], cwd=REPO, capture_output=True, text=True, timeout=120)
    commands = [line.split()[0] for line in in_checkout.stdout.splitlines() if line.startswith("  ")]
    assert len(commands) > 15 and commands == [
        line.split()[0] for line in listed.stdout.splitlines() if line.startswith("  ")
    ]


def test_instance_table_is_one_file():
    """The package's instance table is the Terraform module's file (a link the build copies in)."""
    link = REPO / "trainkit" / "tables" / "instance_types.json"
    assert link.is_symlink()
    assert link.resolve() == (REPO / "terraform" / "modules" / "gpu-nodegroup" / "instance_types.json").resolve()
