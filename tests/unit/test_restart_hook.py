"""The agent's hook before a restart round (trainkit/run/agent.py, RESTART_HOOK_ENV): what it says reaches the node's
log, and a hook that fails does not stop the restart (the workers start from what the node holds)."""

from __future__ import annotations

from trainkit.run.agent import RESTART_HOOK_ENV, before_restart

SAID = []


def fetched() -> str:
    SAID.append("called")
    return "step-00000004: 3 file(s) of the other hosts' parts restored from S3"


def broken() -> str:
    raise PermissionError("AccessDenied on s3:GetObject")


def test_the_hook_runs_and_its_line_is_logged(monkeypatch, capsys):
    monkeypatch.setenv(RESTART_HOOK_ENV, f"{__name__}:fetched")
    before_restart()
    assert SAID == ["called"]
    assert "before the restart: step-00000004: 3 file(s)" in capsys.readouterr().err


def test_a_failing_hook_is_said_and_the_restart_goes_on(monkeypatch, capsys):
    monkeypatch.setenv(RESTART_HOOK_ENV, f"{__name__}:broken")
    before_restart()
    err = capsys.readouterr().err
    assert "before the restart: failed (PermissionError: AccessDenied on s3:GetObject)" in err
    assert "the workers start from what this node holds" in err


def test_no_hook_no_word(monkeypatch, capsys):
    monkeypatch.delenv(RESTART_HOOK_ENV, raising=False)
    before_restart()
    assert capsys.readouterr().err == ""
