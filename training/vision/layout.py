"""The ImageFolder layout on disk: checks before training, and the ILSVRC validation re-layout.

    <root>/train/<wnid>/*.JPEG        one folder per class
    <root>/val/<wnid>/*.JPEG          the same class folders (a subset is fine)

ILSVRC ships `val/` flat, with the labels in `LOC_val_solution.csv` (`ImageId,PredictionString`;
the first token of PredictionString is the wnid). `relayout_val` moves each image into its class
folder with one `rename` per file, so an interrupted run leaves every image in exactly one place and
a second run finishes the job. Nothing here imports torch: the launcher checks a tree in a moment.
"""

from __future__ import annotations

import csv
import filecmp
import os
import time
from dataclasses import dataclass
from pathlib import Path

# torchvision's IMG_EXTENSIONS, so a tree that passes here is one ImageFolder can read.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# Fault injection for tests and drills: seconds to pause after each file, so a kill lands mid-way.
FILE_DELAY_ENV = "TRAINKIT_PREP_FILE_DELAY_S"
VAL_CSV_NAME = "LOC_val_solution.csv"
# Validation resizes the short side to size/0.875, then centre-crops size (224 <- 256).
CROP_RATIO = 0.875


class LayoutError(ValueError):
    """The tree or the CSV is not what training or the re-layout needs; the message says what to change."""


def is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def file_delay() -> float:
    return float(os.environ.get(FILE_DELAY_ENV, "0") or 0)


def _class_dirs(split: Path) -> list[str]:
    return sorted(entry.name for entry in os.scandir(split) if entry.is_dir() and not entry.name.startswith("."))


def _has_image(folder: Path) -> bool:
    return any(entry.is_file() and is_image(entry.name) for entry in os.scandir(folder))


def _loose_images(split: Path) -> int:
    return sum(1 for entry in os.scandir(split) if entry.is_file() and is_image(entry.name))


def check_image_folder(root: str | Path, flag: str = "--data") -> list[str]:
    """The class names of a trainable tree, or a LayoutError naming what is wrong and how to fix it."""
    root = Path(root).expanduser()
    make = "create one with `invoke data.imagenet` (S3 copy) or `invoke data.synthetic-imagenet` (small demo tree)"
    if not root.is_dir():
        raise LayoutError(f"{flag} {root} does not exist; {make}")
    train, val = root / "train", root / "val"
    if not train.is_dir():
        raise LayoutError(f"{flag} {root} has no train/ folder; expected train/<class>/*.JPEG and val/<class>/*.JPEG")
    classes = _class_dirs(train)
    if not classes:
        raise LayoutError(f"{train} has no class folders; expected train/<class>/*.JPEG ({make})")
    for split in (train, val) if val.is_dir() else (train,):
        for name in _class_dirs(split):
            if not _has_image(split / name):
                raise LayoutError(
                    f"class folder {split / name} has no images ({', '.join(IMAGE_EXTENSIONS)}); "
                    "copy its images or remove the folder"
                )
    if not val.is_dir():
        raise LayoutError(f"{flag} {root} has no val/ folder; expected val/<class>/*.JPEG next to train/")
    loose = _loose_images(val)
    if loose:
        raise LayoutError(
            f"{val} holds {loose} images outside class folders (the ILSVRC layout); move them into class folders "
            f"with `invoke data.imagenet --dest {root} --val-csv <{VAL_CSV_NAME}>`"
        )
    unknown = sorted(set(_class_dirs(val)) - set(classes))
    if unknown:
        raise LayoutError(f"{val} has class folders that train/ lacks: {', '.join(unknown[:5])}; remove or rename them")
    if not _class_dirs(val):
        raise LayoutError(f"{val} has no class folders; expected val/<class>/*.JPEG")
    return classes


def read_val_labels(csv_path: str | Path) -> dict[str, str]:
    """ImageId -> wnid from an ILSVRC `LOC_val_solution.csv`."""
    csv_path = Path(csv_path)
    if not csv_path.is_file():
        raise LayoutError(f"validation label file {csv_path} does not exist; pass --val-csv <{VAL_CSV_NAME}>")
    labels: dict[str, str] = {}
    with csv_path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or not {"ImageId", "PredictionString"} <= set(reader.fieldnames):
            raise LayoutError(f"{csv_path} must have the columns ImageId,PredictionString (got {reader.fieldnames})")
        for line, row in enumerate(reader, start=2):
            tokens = (row["PredictionString"] or "").split()
            if not row["ImageId"] or not tokens:
                raise LayoutError(f"{csv_path} line {line}: ImageId and PredictionString must not be empty")
            labels[row["ImageId"]] = tokens[0]
    if not labels:
        raise LayoutError(f"{csv_path} has no rows")
    return labels


@dataclass
class RelayoutReport:
    moved: int = 0
    already_in_place: int = 0
    duplicates_removed: int = 0

    def __str__(self) -> str:
        return (
            f"val re-layout: moved {self.moved}, already in class folders {self.already_in_place}, "
            f"duplicates removed {self.duplicates_removed}"
        )


def _examples(names: list[str]) -> str:
    return ", ".join(sorted(names)[:3]) + (" ..." if len(names) > 3 else "")


def relayout_val(val_dir: str | Path, labels: dict[str, str]) -> RelayoutReport:
    """Move `val/<ImageId>.<ext>` to `val/<wnid>/<ImageId>.<ext>`; idempotent and safe to interrupt.

    Everything is checked before the first move: every loose image must be named by the CSV, and
    every CSV image must exist either loose or in its class folder (not in another class's folder).
    """
    val = Path(val_dir)
    if not val.is_dir():
        raise LayoutError(f"{val} does not exist; copy the validation images first")
    loose = {Path(e.name).stem: Path(e.path) for e in os.scandir(val) if e.is_file() and is_image(e.name)}
    placed: dict[str, str] = {}
    for wnid in _class_dirs(val):
        for entry in os.scandir(val / wnid):
            if entry.is_file() and is_image(entry.name):
                placed[Path(entry.name).stem] = wnid
    unnamed = [name for name in loose if name not in labels]
    if unnamed:
        raise LayoutError(
            f"{val} has {len(unnamed)} images the label CSV does not name ({_examples(unnamed)}); "
            "check that --val-csv belongs to this validation set"
        )
    missing = [image for image in labels if image not in loose and image not in placed]
    if missing:
        raise LayoutError(
            f"the label CSV names {len(missing)} images that are not in {val} ({_examples(missing)}); "
            "finish the copy first, or pass the CSV that belongs to these images"
        )
    misplaced = [image for image, wnid in placed.items() if image in labels and labels[image] != wnid]
    if misplaced:
        raise LayoutError(
            f"{len(misplaced)} images sit in the wrong class folder of {val} ({_examples(misplaced)}); "
            "move them back into val/ and re-run"
        )
    report = RelayoutReport(already_in_place=sum(1 for image in placed if image not in loose))
    delay = file_delay()
    for image, source in sorted(loose.items()):
        target = val / labels[image] / source.name
        target.parent.mkdir(exist_ok=True)
        if target.exists():
            if not filecmp.cmp(source, target, shallow=False):
                raise LayoutError(f"{source} and {target} differ; keep the right one and delete the other")
            source.unlink()  # the same image twice: keep the one in its class folder
            report.duplicates_removed += 1
        else:
            os.rename(source, target)
            report.moved += 1
        if delay:
            time.sleep(delay)
    return report
