"""Image trees on disk as the tests read them."""

from __future__ import annotations

from pathlib import Path


def tree_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def val_images(val: Path) -> list[Path]:
    return sorted(p for p in val.rglob("*.JPEG"))
