"""`invoke obs.report`: a PNG from a real run's files (the session's `make train`). `invoke obs.grafana`:
tests/integration/test_obs_grafana.py."""

from __future__ import annotations

import json
import shutil

from PIL import Image

from tests.helpers.product import invoke
from trainkit.plan.report import scaling_points


def test_report_of_a_real_run_is_a_readable_png(tiny_run, tmp_path):
    output = tmp_path / "report.png"
    result = invoke("obs.report", "--run", tiny_run.name, "--runs-dir", str(tiny_run.parent), "--output", str(output))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"report written: {output}"
    with Image.open(output) as image:
        assert image.format == "PNG" and image.width >= 1200 and image.height >= 800
        assert image.text["Title"].startswith(f"trainkit run {tiny_run.name}: llama2-tiny")


def test_report_names_the_runs_it_knows_when_the_run_is_wrong(tiny_run):
    result = invoke("obs.report", "--run", "no-such-run", "--runs-dir", str(tiny_run.parent))
    assert result.returncode == 2
    assert "no-such-run" in result.stderr and tiny_run.name in result.stderr and "--runs-dir" in result.stderr


def test_scaling_points_take_each_runs_world_size_and_median_throughput(tiny_run, tmp_path):
    for name, world, median in (("one", 1, 1000.0), ("two", 2, 1800.0), ("two-again", 2, 1700.0)):
        run = tmp_path / name
        shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("checkpoints", "model", "logs"))
        (run / "events.jsonl").write_text(json.dumps({"event": "start", "world_size": world}) + "\n")
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "tokens_per_s_median": median}))
    other = tmp_path / "other-model"
    shutil.copytree(tmp_path / "one", other)
    spec = json.loads((other / "spec.json").read_text())
    (other / "spec.json").write_text(json.dumps({**spec, "model": {**spec["model"], "name": "llama2-7b"}}))
    assert scaling_points(tmp_path, "llama2-tiny", "tokens_per_s") == {1: 1000.0, 2: 1800.0}
    result = invoke("obs.report", "--run", "two", "--runs-dir", str(tmp_path))
    assert result.returncode == 0 and (tmp_path / "two" / "report.png").exists(), result.stderr
