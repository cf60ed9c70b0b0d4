"""The training image's `cpu` flavour built the way a user builds it, for tests/e2e/test_training_image.py, in the
background from early in the session (tests/helpers/background.py): a Debian base made with debootstrap and
committed with buildah, then `invoke images.build --target cpu` on it. buildah keeps everything under a
storage.conf of its own (vfs driver, graph root in the build's folder); `remove` deletes it all.

Run as `python -m tests.helpers.image_build FOLDER`; it needs root, buildah and debootstrap (`make test-services`).
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from tests.helpers.background import Background
from tests.helpers.paths import BIN

MODULE = "e2e/test_training_image.py"  # relative to tests/
BASE = "localhost/trainkit-test-debian:bookworm"
TAG = "cpu-test"
IMAGE = f"localhost/trainkit-train:{TAG}"
# The CA bundle this machine's pip trusts (PIP_CERT, else the one Python's ssl uses): what the build's pip gets as
# its secret, found where this machine keeps it rather than assumed.
_VERIFY = ssl.get_default_verify_paths()
HOST_CA = Path(os.environ.get("PIP_CERT") or _VERIFY.cafile or _VERIFY.openssl_cafile)


def buildah_env(root: Path) -> dict:
    storage = {"CONTAINERS_STORAGE_CONF": str(root / "storage.conf"), "BUILDAH_ISOLATION": "chroot"}
    return {**os.environ, **storage, "TRAINKIT_STATE_DIR": str(root / "state")}  # the build's record and context


def debian_mirror() -> str:
    """This machine's Debian mirror, from apt's sources (deb822 or one-line format)."""
    for path in [Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")]:
        for line in path.read_text().splitlines() if path.is_file() else []:
            if line.startswith(("URIs:", "deb ")) and "security" not in line:
                return line.split()[1]
    return "http://deb.debian.org/debian"


def torch_wheels() -> str:
    """The folder holding the wheel of the torch this venv runs (`make setup` installed the CPU build from a folder
    pip's find-links names): the image installs that same build. Every scope pip reads counts, the environment's
    PIP_FIND_LINKS included: CI runs with an empty HOME, where the user's pip.conf is not read. Without it the build
    would take PyPI's CUDA build (5 GB of NVIDIA libraries, copied whole per layer by the vfs driver), so its
    absence stops the build here with what to change."""
    version = metadata.version("torch")
    listed = subprocess.run([str(BIN / "pip"), "config", "list"], capture_output=True, text=True).stdout
    folders = [
        f for line in listed.splitlines() if ".find-links=" in line for f in line.split("=", 1)[1].strip("'").split()
    ]
    for folder in folders:
        if list(Path(folder).glob(f"torch-{version}-*.whl")):
            return folder
    raise SystemExit(
        f"no wheel of the venv's torch {version} in pip's find-links ({', '.join(folders) or 'none set'}): put it "
        "in a folder and name that folder in PIP_FIND_LINKS, so the image installs the same CPU build"
    )


def run(command: list[str], env: dict | None = None) -> str:
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    print(done.stdout, done.stderr, sep="", flush=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} ... failed (exit {done.returncode})")
    return done.stdout.strip()


def build(root: Path) -> None:
    missing = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"{', '.join(missing)} not installed: run `make test-services`")
    if os.geteuid() != 0:
        raise SystemExit("the image test builds as root (debootstrap, buildah's chroot isolation)")
    wheels = torch_wheels()
    (root / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{root / "graph"}"\nrunroot = "{root / "run"}"\n'
    )
    env, rootfs = buildah_env(root), root / "rootfs"
    debootstrap = ["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates"]
    run([*debootstrap, "bookworm", str(rootfs), debian_mirror()])
    working = run(["buildah", "from", "scratch"], env)
    mounted = run(["buildah", "mount", working], env)
    run(["cp", "-a", f"{rootfs}/.", mounted])
    run(["buildah", "umount", working], env)
    run(["buildah", "commit", "--quiet", working, BASE], env)
    run(["buildah", "rm", working], env)
    shutil.rmtree(rootfs)
    args = ["--target", "cpu", "--base", BASE, "--tag", TAG, "--torch-index", "", "--ca-bundle", str(HOST_CA)]
    # One commit per stage instead of one per step: the vfs driver keeps a whole copy of the tree per layer.
    args += ["--wheels", wheels, "--no-layer-cache"]
    os.execve(str(BIN / "invoke"), ["invoke", "images.build", *args], env)


def start() -> Background:
    return Background("image", [sys.executable, "-m", "tests.helpers.image_build", "{root}"], timeout_s=1200)


def remove(background: Background) -> None:
    background.stop()
    env = buildah_env(background.root)
    if (background.root / "storage.conf").is_file():
        subprocess.run(["buildah", "rm", "--all"], env=env, capture_output=True)
        subprocess.run(["buildah", "rmi", "--all", "--force"], env=env, capture_output=True)
    background.remove()


if __name__ == "__main__":
    build(Path(sys.argv[1]))
