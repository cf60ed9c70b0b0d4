"""A local run's owner record (launcher.json), in-process: a pid is the run's only with the start time it
was recorded with; and the folders that are the user's own (the state folder, a runs folder made for a run)."""

from __future__ import annotations

import json
import os
import stat

from trainkit.backends.local.runs import OWNER_FILE, owner_pid, record_owner, run_lock
from trainkit.paths import STATE_ENV, make_folder, state_dir


def test_a_dead_launchers_pid_reused_by_another_process_is_not_taken_for_the_run(tmp_path):
    """launcher.json outlives a SIGKILLed launcher; `stop` must not signal whatever process got its pid."""
    run_dir = tmp_path / "runs" / "old"
    run_dir.mkdir(parents=True)
    record_owner(run_dir)
    assert owner_pid(run_dir) == os.getpid()
    owner = json.loads((run_dir / OWNER_FILE).read_text())
    (run_dir / OWNER_FILE).write_text(json.dumps({**owner, "started": "1"}))  # same pid, another process
    assert owner_pid(run_dir) is None


def test_the_state_folder_and_a_runs_folder_made_for_a_run_are_private_and_a_shared_runs_folder_stays_shared(
    tmp_path, monkeypatch
):
    """Under a umask that leaves folders open to all (022: 0755), as most machines have it."""

    def mode(path):
        return stat.S_IMODE(path.stat().st_mode)

    umask = os.umask(0o022)
    try:
        state = tmp_path / "project" / ".trainkit"
        monkeypatch.setenv(STATE_ENV, str(state))
        assert state_dir() == state and not (tmp_path / "project").exists()  # reading it makes nothing
        make_folder(state / "aws")  # as the first thing written there
        assert [mode(tmp_path / "project"), mode(state), mode(state / "aws")] == [0o755, 0o700, 0o755]
        state.chmod(0o755)  # as an earlier trainkit made it
        assert state_dir() == state and mode(state) == 0o700
        with run_lock(tmp_path / "mine" / "runs" / "first"):
            pass
        assert [mode(tmp_path / "mine" / p) for p in ("", "runs", "runs/first")] == [0o755, 0o700, 0o755]
        team = tmp_path / "team-runs"
        team.mkdir()
        team.chmod(0o775)
        with run_lock(team / "second"):
            pass
        assert mode(team) == 0o775  # a folder its owner shares keeps its rights
    finally:
        os.umask(umask)
