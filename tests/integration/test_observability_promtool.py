"""The generated alert rules through promtool (Debian's prometheus package): `promtool check rules` passes,
the unit tests pass, and they would catch a broken rule."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from observability import rules
from tests.helpers.observability_files import RULES_FILE, UNIT_TESTS


def promtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing: run `make test-services` (Debian's prometheus package)")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


def test_promtool_check_rules_passes():
    result = promtool("check", "rules", str(RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules.alerts())} rules found" in result.stdout


def test_promtool_unit_tests_pass():
    result = promtool("test", "rules", str(UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_would_catch_a_broken_rule(tmp_path):
    """The unit tests are not vacuous: with the NaN check removed, the loss test fails."""
    groups = rules.rule_groups()
    for group in groups["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == "TrainingLossNotFinite":
                rule["expr"] = "count by (run_id, model) (abs(trainkit_train_loss) == Inf) > 0"
    broken = tmp_path / "generated" / "rules" / RULES_FILE.name
    broken.parent.mkdir(parents=True)
    broken.write_text(yaml.safe_dump(groups))
    (tmp_path / "tests").mkdir()
    shutil.copy(UNIT_TESTS, tmp_path / "tests" / UNIT_TESTS.name)
    result = promtool("test", "rules", str(tmp_path / "tests" / UNIT_TESTS.name))
    assert result.returncode != 0 and "alertname: TrainingLossNotFinite" in result.stdout + result.stderr
