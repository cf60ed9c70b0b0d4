"""A user's code folder as it travels with a job: which files go (hidden entries and __pycache__ stay), at most
how much (what one ConfigMap carries, so code that runs here runs on the cluster too), and the hash that names
the folder it lands in."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from trainkit.errors import SpecError

# Kubernetes refuses a ConfigMap whose data and binaryData hold more than 1 MiB together (kubernetes
# pkg/apis/core/validation ValidateConfigMap against core.MaxSecretSize, 1048576 bytes); keys and metadata need room.
CODE_LIMIT_BYTES = 900 * 1024
CODE_LIMIT_FILES = 200


def code_files(folder: Path, runs_dir: str | Path | None = None) -> dict[str, Path]:
    """The files of a script's folder that travel with it: relative POSIX path -> file, without hidden entries,
    __pycache__ and the runs folder when it lies inside (`invoke run --script train.py` in the script's own folder
    keeps its runs there: their checkpoints are no code, and the preparation writes there while the code is hashed);
    refused when they would not fit what carries them."""
    found: dict[str, Path] = {}
    runs = Path(runs_dir).resolve() if runs_dir is not None else None
    # Links followed: a ConfigMap volume is a tree of links into a hidden `..data` folder.
    for root, folders, names in os.walk(folder, followlinks=True):
        folders[:] = [
            name
            for name in folders
            if not (name.startswith(".") or name == "__pycache__" or (Path(root) / name).resolve() == runs)
        ]
        for name in names:
            path = Path(root) / name
            if not name.startswith(".") and path.is_file():
                found[path.relative_to(folder).as_posix()] = path
    found = dict(sorted(found.items()))
    size = sum(path.stat().st_size for path in found.values())
    if size > CODE_LIMIT_BYTES or len(found) > CODE_LIMIT_FILES:
        biggest = sorted(found, key=lambda name: found[name].stat().st_size, reverse=True)[:3]
        raise SpecError(
            f"--script: its folder {folder} holds {len(found)} files, {size / 1024:.0f} KiB (largest: "
            f"{', '.join(biggest)}); the code that travels with a job is at most {CODE_LIMIT_FILES} files and "
            f"{CODE_LIMIT_BYTES // 1024} KiB: move the script and the modules it imports into a folder of their own, "
            "or build them into an image and pass --image"
        )
    return found


def code_digest(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return digest.hexdigest()[:12]


def read_code(folder: Path, runs_dir: str | Path | None = None) -> dict[str, bytes]:
    """What travels of `folder` (see code_files), by relative path."""
    return {name: path.read_bytes() for name, path in code_files(folder, runs_dir).items()}
