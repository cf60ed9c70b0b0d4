"""The generated observability files the tests read (observability/generated, observability/tests)."""

from __future__ import annotations

from pathlib import Path

from observability import generate

OBS = Path(generate.__file__).resolve().parent
RULES_FILE = OBS / "generated" / "rules" / "trainkit-alerts.rules.yaml"
UNIT_TESTS = OBS / "tests" / "alerts.test.yaml"  # promtool's unit tests of the alert rules
