"""The disk estimate against what a real run (the session's `make train`) wrote."""

from __future__ import annotations

import json

from training.spec import Job
from trainkit.job.models import get_model
from trainkit.run.storage import storage_need


def folder_bytes(path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_the_estimate_matches_what_a_real_run_wrote(tiny_run):
    spec = Job.from_dict(json.loads((tiny_run / "spec.json").read_text()))
    need = storage_need(spec, get_model(spec.model.name))
    checkpoints = sorted((tiny_run / "checkpoints").glob("step-*"))
    assert checkpoints
    for checkpoint in checkpoints:
        # Parameters and AdamW moments in fp32; the rest (RNG states, metadata) is a few kilobytes.
        assert need.checkpoint_bytes <= folder_bytes(checkpoint) <= need.checkpoint_bytes * 1.05 + 200_000
    weights = sum(p.stat().st_size for p in (tiny_run / "model").glob("*.safetensors"))
    assert need.export_bytes <= weights <= need.export_bytes * 1.01 + 100_000
