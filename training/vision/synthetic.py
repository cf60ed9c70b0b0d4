"""A small, real-JPEG ImageNet-layout tree for tests and the local demo (`invoke data.synthetic-imagenet`).

Each class has its own hue; every image is that colour under random brightness and uniform noise,
so a small network learns the classes in a few epochs while the whole input pipeline (JPEG decode,
random resized crop, flip, normalisation) runs for real. Deterministic for a given seed. Written
aside and renamed into place, so a half-written tree is never mistaken for a finished one.
"""

from __future__ import annotations

import colorsys
import csv
import json
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from PIL import Image

from ..common.files import tmp_sibling
from .layout import VAL_CSV_NAME, LayoutError

MARKER = ".trainkit-synthetic.json"


@dataclass(frozen=True)
class SyntheticTree:
    classes: int = 10
    per_class: int = 40
    val_per_class: int = 10
    size: int = 40
    seed: int = 0
    flat_val: bool = False
    """Write val/ flat with a LOC_val_solution.csv, as ILSVRC ships it (to exercise the re-layout)."""

    def __post_init__(self) -> None:
        for name in ("classes", "per_class", "val_per_class", "size"):
            if getattr(self, name) < 1:
                raise LayoutError(f"--{name.replace('_', '-')} must be a positive integer (got {getattr(self, name)})")
        if self.classes > 1000:
            raise LayoutError(f"--classes {self.classes}: at most 1000 (ImageNet's class count)")


def wnid(index: int) -> str:
    return f"n{index:08d}"


def _image(rng: random.Random, hue: float, size: int) -> Image.Image:
    brightness = rng.uniform(0.55, 1.0)
    red, green, blue = (int(255 * c) for c in colorsys.hsv_to_rgb(hue, 0.8, brightness))
    base = Image.new("RGB", (size, size), (red, green, blue))
    noise = Image.frombytes("L", (size, size), rng.randbytes(size * size)).convert("RGB")
    return Image.blend(base, noise, alpha=0.35)


def write_tree(dest: str | Path, tree: SyntheticTree) -> Path:
    """Write the tree to `dest` (or return at once if the same tree is already there)."""
    dest = Path(dest).expanduser()
    marker = dest / MARKER
    if marker.is_file():
        if json.loads(marker.read_text()) == asdict(tree):
            return dest
        raise LayoutError(f"{dest} holds a synthetic tree with other settings; choose another --dest or delete it")
    if dest.exists() and any(dest.iterdir()):
        raise LayoutError(f"{dest} exists and is not empty; choose another --dest")
    tmp = tmp_sibling(dest)
    rng = random.Random(tree.seed)
    val_rows = []
    serial = 0
    for index in range(tree.classes):
        name, hue = wnid(index), index / tree.classes
        (tmp / "train" / name).mkdir(parents=True)
        for j in range(tree.per_class):
            _image(rng, hue, tree.size).save(tmp / "train" / name / f"{name}_{j}.JPEG", quality=90)
        for _ in range(tree.val_per_class):
            serial += 1
            image_id = f"ILSVRC2012_val_{serial:08d}"
            folder = tmp / "val" if tree.flat_val else tmp / "val" / name
            folder.mkdir(parents=True, exist_ok=True)
            _image(rng, hue, tree.size).save(folder / f"{image_id}.JPEG", quality=90)
            val_rows.append((image_id, f"{name} 0 0 {tree.size - 1} {tree.size - 1}"))
    if tree.flat_val:
        with (tmp / VAL_CSV_NAME).open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["ImageId", "PredictionString"])
            writer.writerows(val_rows)
    (tmp / MARKER).write_text(json.dumps(asdict(tree)) + "\n")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        if dest.exists():
            dest.rmdir()  # empty, checked above
        tmp.rename(dest)
    except OSError:
        # Another writer (a pod on the same volume) published first; theirs is the same tree.
        shutil.rmtree(tmp, ignore_errors=True)
        if not marker.is_file() or json.loads(marker.read_text()) != asdict(tree):
            raise
    return dest
