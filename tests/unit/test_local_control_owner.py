"""A local run's owner record (launcher.json), in-process: a pid is the run's only with the start time it
was recorded with."""

from __future__ import annotations

import json
import os

from trainkit.backends.local.runs import OWNER_FILE, owner_pid, record_owner


def test_a_dead_launchers_pid_reused_by_another_process_is_not_taken_for_the_run(tmp_path):
    """launcher.json outlives a SIGKILLed launcher; `stop` must not signal whatever process got its pid."""
    run_dir = tmp_path / "runs" / "old"
    run_dir.mkdir(parents=True)
    record_owner(run_dir)
    assert owner_pid(run_dir) == os.getpid()
    owner = json.loads((run_dir / OWNER_FILE).read_text())
    (run_dir / OWNER_FILE).write_text(json.dumps({**owner, "started": "1"}))  # same pid, another process
    assert owner_pid(run_dir) is None
