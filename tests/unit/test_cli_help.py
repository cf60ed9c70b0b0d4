"""`invoke TASK --help` prints help for every task and runs nothing: Invoke hands a positional parameter the next
word, `--help` included, so a task's required values are options (trainkit/cli/options.py: required), and the one
positional left (`invoke bench WHAT`) prints its help itself."""

from __future__ import annotations

import contextlib
import copy
import io

import pytest
from invoke import Program

from trainkit.cli import namespace


def program() -> Program:
    """A Program over a copy of the commands: parsing takes each task's help texts off it (invoke/tasks.py)."""
    return Program(namespace=copy.deepcopy(namespace), binary="invoke")


def invoke_here(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        program().run(["invoke", *argv], exit=False)
    return out.getvalue()


@pytest.mark.parametrize("name", sorted(namespace.task_names))
def test_help_of_every_task_creates_nothing(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shown = invoke_here(name, "--help")
    assert shown.startswith("Usage: invoke ") and f" {name} " in shown.splitlines()[0]
    assert "Options:" in shown or name == "infra.outputs"  # the one task without options
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["data.synthetic-imagenet"], "--dest is required: the folder to create"),
        (["data.imagenet", "--dry-run"], "--dest is required: the folder to write the ImageFolder tree into"),
        (["obs.report"], "--run is required: the run id to report on"),
    ],
)
def test_a_required_value_left_out_is_a_one_line_error(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        program().run(["invoke", *argv])
    assert stopped.value.code == 2 and capsys.readouterr().err == f"error: {message}\n"
    assert list(tmp_path.iterdir()) == []
