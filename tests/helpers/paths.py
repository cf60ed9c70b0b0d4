"""Where things are: the repository, the data the tests share, and this venv's commands."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
HELPERS = TESTS / "helpers"  # also holds the scripts some tests run under torchrun
GOLDEN = TESTS / "golden"  # rendered manifests the EKS tests compare against
SCHEMAS = TESTS / "schemas"
PYTORCHJOB_SCHEMA = SCHEMAS / "pytorchjob-v1.json"  # the training-operator v1 CRD's fields
BIN = Path(sys.executable).parent
