"""Every trivy:ignore comment in terraform/ says why, read from the files (the scans themselves run in
tests/integration/test_security_scans.py)."""

from __future__ import annotations

import re

from tests.helpers.paths import REPO


def test_every_trivy_ignore_says_why():
    for path in (REPO / "terraform").rglob("*.tf"):
        for line in path.read_text().splitlines():
            if "trivy:ignore" in line:
                assert re.search(r"trivy:ignore:\S+\s+\S.{10,}", line), f"{path}: {line.strip()} needs a reason"
