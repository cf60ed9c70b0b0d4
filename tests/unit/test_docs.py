"""The README keeps its two set-up commands at the top; the generated pages (docs/generate.py) are current and name
every train flag and metric."""

from __future__ import annotations

import runpy

from tests.helpers.paths import REPO
from training.common.job import fields_of

README = (REPO / "README.md").read_text()


def test_readme_opens_with_exactly_the_two_setup_commands():
    commands = [line.split("#")[0].strip() for line in README.splitlines()[2:4]]
    assert commands == ["make train MODEL=llama2-tiny", "make test"]


def test_the_generated_pages_are_current():
    generator = runpy.run_path(str(REPO / "docs" / "generate.py"))
    assert generator["changed"](write=False) == [], "run `make docs` (python docs/generate.py) and commit the result"


def test_every_train_flag_is_in_the_command_reference():
    reference = (REPO / "docs" / "reference" / "commands.md").read_text()
    train = reference.partition("## `invoke train`")[2].partition("\n## ")[0]
    missing = [spec.flag for spec in fields_of(cli=True) if f"`{spec.flag}`" not in train]
    assert not missing, missing


def test_every_exported_metric_is_in_the_metrics_contract():
    from training.common.metrics import GAUGES

    contract = (REPO / "observability" / "README.md").read_text()
    missing = [name for name in GAUGES if f"`{name}`" not in contract]
    assert not missing, missing
