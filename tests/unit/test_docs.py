"""The README keeps its two set-up commands at the top and documents every train flag."""

from __future__ import annotations

from tests.helpers.paths import REPO
from training.common.job import fields_of

README = (REPO / "README.md").read_text()


def test_readme_opens_with_exactly_the_two_setup_commands():
    commands = [line.split("#")[0].strip() for line in README.splitlines()[2:4]]
    assert commands == ["make train MODEL=llama2-tiny", "make test"]


def test_every_train_flag_is_documented():
    missing = [spec.flag for spec in fields_of(cli=True) if spec.flag not in README]
    assert not missing, missing


def test_every_exported_metric_is_in_the_metrics_contract():
    from training.common.metrics import GAUGES

    contract = (REPO / "observability" / "README.md").read_text()
    missing = [name for name in GAUGES if f"`{name}`" not in contract]
    assert not missing, missing
