"""The job is declared once: the walks (tests/helpers/jobs.py) give every option a value, an earlier flat
spec.json is still read, and training/ and observability/ never import the launcher. Through the command
line: tests/integration/test_job_model_cli.py; a real run's spec.json: tests/e2e/test_job_model_runs.py."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.jobs import WALKS
from tests.helpers.paths import REPO
from training.spec import Job, fields_of


def test_the_walks_give_every_option_a_value():
    given = {key for values in WALKS.values() for key in values}
    assert given == {spec.key for spec in fields_of(cli=True)}


def test_an_earlier_flat_spec_json_is_still_read():
    flat = {"model": "llama2-7b", "steps": 10, "nproc": 8, "run_id": "old", "rdzv_endpoint": "h:1"}
    job = Job.from_dict(flat)
    assert (job.model.name, job.optimisation.steps, job.parallelism.nproc) == ("llama2-7b", 10, 8)
    assert (job.run.run_id, job.elastic.rdzv_endpoint) == ("old", "h:1")


def _importers_of(folder: Path, package: str) -> list[str]:
    """Files under `folder` that import `package` (absolute imports; relative ones stay inside)."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = {node.module.split(".")[0]}
            else:
                continue
            if package in names:
                found.append(str(path.relative_to(folder)))
                break
    return found


def test_imports_go_one_way():
    """training/ runs in the image without the launcher; observability/ is used by the launcher, never the
    other way round, so there is no cycle between the two packages."""
    assert _importers_of(REPO / "training", "trainkit") == []
    assert _importers_of(REPO / "observability", "trainkit") == []


def test_the_import_check_finds_a_planted_import(tmp_path):
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "a.py").write_text("import os\n\ndef f():\n    from trainkit.job import build\n")
    (tmp_path / "b.py").write_text("import trainkit.backends.eks.cluster as c\n")
    (tmp_path / "c.py").write_text("from . import trainkit\n")  # relative: a module of its own package
    assert _importers_of(tmp_path, "trainkit") == ["b.py", "deep/a.py"]
