"""The spec.json a real run (the session's `make train`) wrote is what its workers read."""

from __future__ import annotations

import json

from training.spec import read_job


def test_a_real_runs_spec_json_is_what_its_workers_read(tiny_run):
    written = json.loads((tiny_run / "spec.json").read_text())
    worker = read_job(tiny_run / "spec.json")
    assert worker.to_dict() == written
    assert worker.model.name == "llama2-tiny" and worker.run_dir.name == tiny_run.name
