"""`invoke bench runs` (trainkit/bench/runs.py): what a run wrote against the disk check's prediction, the commands
being the ones the docs quote, and the suite's record read from a CI log (docs/generate.py --suite-log)."""

from __future__ import annotations

import json
import re
import runpy

import pytest

from tests.helpers.paths import REPO
from training.common.checkpoint import COMPLETE_MARKER
from training.spec import SPEC_FILE
from trainkit.bench import runs
from trainkit.job import build

GENERATOR = runpy.run_path(str(REPO / "docs" / "generate.py"))


def test_each_recorded_command_is_quoted_as_written_in_the_page_it_serves():
    """In the page or a generated part of it, which is rendered from that run's record (its notice names it)."""
    for name, (quoted, flags) in runs.RUNS.items():
        page = (REPO / quoted.split(":")[0].split(" and ")[0]).read_text()
        parts = [(REPO / part).read_text() for part in re.findall(r'--8<-- "(docs/generated/[^"]+)"', page)]
        command = "invoke train " + " ".join(flag.format(runs="runs") for flag in flags)
        assert command in page + "".join(parts), name
        rendered_from = {
            run
            for part in parts
            for only in re.findall(r"bench runs --only ([\w,.-]+)", part)
            for run in only.split(",")
        }
        assert name in rendered_from, name


def test_what_a_run_wrote_is_measured_from_its_files_beside_the_prediction(tmp_path):
    job = build({"model": "llama2-7b", "layers": 1, "steps": 5})
    (tmp_path / SPEC_FILE).write_text(json.dumps(job.to_dict()))
    older, newer = tmp_path / "checkpoints" / "step-00000002", tmp_path / "checkpoints" / "step-00000005"
    for folder, size in ((older, 10), (newer, 7)):
        (folder / "shard").mkdir(parents=True)
        (folder / "shard" / "0.bin").write_bytes(b"x" * size)
        (folder / COMPLETE_MARKER).write_text("")
    (tmp_path / "checkpoints" / ".tmp-step-00000006").mkdir()  # not published: not counted
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"y" * 3)
    wrote = runs.written(tmp_path)
    assert wrote["checkpoint_bytes"] == 7  # the newest published one, its files summed (the marker is empty)
    assert wrote["export_bytes"] == 3
    assert wrote["checkpoint_bytes_predicted"] == 12 * wrote["parameters"]  # fp32 weights + AdamW's two moments
    assert wrote["export_bytes_predicted"] == 4 * wrote["parameters"]


def test_a_lora_run_is_measured_by_its_adapters_and_both_its_exports(tmp_path):
    flags = {"model": "llama2-7b", "layers": 1, "steps": 5, "init": "pretrained", "lora_rank": 8}
    job = build({**flags, "export": "merged"})
    (tmp_path / SPEC_FILE).write_text(json.dumps(job.to_dict()))
    for folder, name, size in (("model", "adapter_model.safetensors", 5), ("model-merged", "model.safetensors", 11)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_bytes(b"z" * size)
    wrote = runs.written(tmp_path)
    assert wrote["adapter_bytes"] == 5 and wrote["export_bytes"] == 16  # the adapter folder and the merged model
    trained = wrote["trained"]
    assert 0 < trained < wrote["parameters"] and wrote["checkpoint_bytes"] is None  # no checkpoint published
    assert wrote["checkpoint_bytes_predicted"] == 12 * trained
    assert wrote["export_bytes_predicted"] == 4 * trained + 4 * wrote["parameters"]


def test_an_unknown_run_is_refused_with_the_choices():
    with pytest.raises(Exception, match="resnet-tiny"):
        runs.bench(None, ["resnet"])


def test_the_suite_record_is_read_from_a_ci_log(tmp_path, monkeypatch):
    log = tmp_path / "ci.log"
    log.write_text(
        "ci: commit abc1234\nci: machine 2 cores, 24 GiB\n"
        "background image: 241 s\n"
        "30.50s setup    tests/e2e/test_chaos.py::test_one\n"
        "12.25s call     tests/e2e/test_chaos.py::test_one\n"
        "2.00s call     tests/unit/test_docs.py::test_two[x]\n"
        "(12 durations < 0.005s hidden.  Use -vv to show these durations.)\n"
        "625 passed in 1419.93s (0:23:39)\nci: disk peak 24123 MB above the start\nci: 1507 s in all\n"
    )
    monkeypatch.setitem(GENERATOR["record_suite"].__globals__, "SUITE", tmp_path / "suite.json")
    record = GENERATOR["record_suite"](log)
    assert record["tests_passed"] == 625 and record["pytest_s"] == 1420 and record["total_s"] == 1507
    assert record["layers_s"] == {"e2e": 42.8, "unit": 2.0}
    assert record["background_s"] == {"image": 241}
    assert record["disk_peak_mb"] == 24123
    assert record["slowest"][0] == {"test": "tests/e2e/test_chaos.py::test_one", "phase": "setup", "seconds": 30.5}


def test_a_log_without_the_ci_lines_is_refused(tmp_path):
    log = tmp_path / "ci.log"
    log.write_text("625 passed in 10.0s\n")
    with pytest.raises(SystemExit, match="ci: commit"):
        GENERATOR["record_suite"](log)
