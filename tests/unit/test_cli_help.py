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


@pytest.mark.parametrize("word", ["--help", "-h"])
@pytest.mark.parametrize("name", sorted(namespace.task_names))
def test_help_of_every_task_creates_nothing(name, word, tmp_path, monkeypatch):
    """`-h` too: Invoke's automatic short flags gave it to `--epochs` and `--hf-token-file` (issue 51)."""
    monkeypatch.chdir(tmp_path)
    shown = invoke_here(name, word)
    assert shown.startswith("Usage: invoke ") and f" {name} " in shown.splitlines()[0]
    assert "Options:" in shown or name == "infra.outputs"  # the one task without options
    assert list(tmp_path.iterdir()) == []


def test_no_option_has_a_short_flag_but_logs_follow():
    """Every option is its long name: letters nobody could guess (`-o` was --model, `-q` --seq-len) are gone; `logs -f`
    stays, as `tail -f` (the README's `invoke logs -f`)."""
    shorts = {
        f"{name} {argument.name}": argument.names
        for name in namespace.task_names
        for argument in copy.deepcopy(namespace[name]).get_arguments()
        if any(len(alias) == 1 for alias in argument.names)
    }
    assert shorts == {"logs follow": ("follow", "f")}


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
