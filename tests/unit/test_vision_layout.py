"""ImageFolder trees on disk: the synthetic tree, the checks before training, and the val re-layout, in-process
(the re-layout as a killed and re-run process: tests/integration/test_vision_relayout_process.py)."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers.images import tree_files, val_images
from training.vision.layout import (
    VAL_CSV_NAME,
    LayoutError,
    check_image_folder,
    read_val_labels,
    relayout_val,
)
from training.vision.synthetic import SyntheticTree, write_tree


def test_synthetic_tree_is_deterministic_idempotent_and_trainable(tmp_path):
    tree = SyntheticTree(classes=3, per_class=4, val_per_class=2, size=24, seed=5)
    first, second = write_tree(tmp_path / "a", tree), write_tree(tmp_path / "b", tree)
    assert tree_files(first) == tree_files(second)  # same seed, same JPEG bytes
    assert check_image_folder(first) == ["n00000000", "n00000001", "n00000002"]
    assert len(list((first / "train").rglob("*.JPEG"))) == 12 and len(val_images(first / "val")) == 6
    before = {p: p.stat().st_mtime_ns for p in first.rglob("*")}
    assert write_tree(first, tree) == first  # the same tree again: nothing rewritten
    assert {p: p.stat().st_mtime_ns for p in first.rglob("*")} == before
    with pytest.raises(LayoutError, match="other settings"):
        write_tree(first, SyntheticTree(classes=4))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("mine")
    with pytest.raises(LayoutError, match="not empty"):
        write_tree(tmp_path / "busy", tree)
    assert not list(tmp_path.glob(".*tmp*"))  # no half-written tree left beside


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda r: shutil.rmtree(r), "does not exist"),
        (lambda r: shutil.rmtree(r / "train"), "has no train/ folder"),
        (lambda r: [p.unlink() for p in (r / "train" / "n00000001").iterdir()], "n00000001 has no images"),
        (lambda r: shutil.rmtree(r / "val"), "has no val/ folder"),
        (lambda r: (r / "val" / "n00000000" / "extra.JPEG").rename(r / "val" / "extra.JPEG"), "outside class"),
        (lambda r: (r / "val" / "n00000000").rename(r / "val" / "n99999999"), "that train/ lacks: n99999999"),
    ],
)
def test_tree_problems_are_named_before_training(damage, message, tmp_path):
    root = write_tree(tmp_path / "t", SyntheticTree(classes=3, per_class=2, val_per_class=2, size=16))
    (root / "val" / "n00000000" / "ILSVRC2012_val_00000001.JPEG").rename(root / "val" / "n00000000" / "extra.JPEG")
    damage(root)
    with pytest.raises(LayoutError, match=message):
        check_image_folder(root)


def test_relayout_puts_every_image_in_its_class_once_and_a_second_run_changes_nothing(flat):
    labels = read_val_labels(flat / VAL_CSV_NAME)
    before = {p.name: p.read_bytes() for p in val_images(flat / "val")}
    assert len(before) == 20 and all(p.parent == flat / "val" for p in val_images(flat / "val"))
    report = relayout_val(flat / "val", labels)
    assert (report.moved, report.already_in_place) == (20, 0)
    after = val_images(flat / "val")
    assert {p.name: p.read_bytes() for p in after} == before  # nothing lost, nothing duplicated
    assert all(p.parent.name == labels[p.stem] for p in after)
    assert check_image_folder(flat) == [f"n{i:08d}" for i in range(4)]
    snapshot = tree_files(flat)
    again = relayout_val(flat / "val", labels)
    assert (again.moved, again.already_in_place, again.duplicates_removed) == (0, 20, 0)
    assert tree_files(flat) == snapshot


def test_a_copy_that_brought_back_flat_duplicates_is_cleaned_up(flat):
    labels = read_val_labels(flat / VAL_CSV_NAME)
    relayout_val(flat / "val", labels)
    placed = val_images(flat / "val")[0]
    shutil.copy(placed, flat / "val" / placed.name)
    report = relayout_val(flat / "val", labels)
    assert report.duplicates_removed == 1 and len(val_images(flat / "val")) == 20


def test_csv_naming_unknown_files_stops_before_moving_anything(flat):
    labels = read_val_labels(flat / VAL_CSV_NAME)
    snapshot = tree_files(flat)
    with pytest.raises(LayoutError, match=r"names 1 images that are not in .*ILSVRC2012_val_99999999"):
        relayout_val(flat / "val", {**labels, "ILSVRC2012_val_99999999": "n00000000"})
    unnamed = dict(list(labels.items())[1:])
    with pytest.raises(LayoutError, match="1 images the label CSV does not name"):
        relayout_val(flat / "val", unnamed)
    assert tree_files(flat) == snapshot


def test_bad_label_csv_is_a_clear_error(tmp_path):
    (tmp_path / "bad.csv").write_text("id,label\nx,n1\n")
    with pytest.raises(LayoutError, match="columns ImageId,PredictionString"):
        read_val_labels(tmp_path / "bad.csv")
    (tmp_path / "empty.csv").write_text("ImageId,PredictionString\nILSVRC2012_val_1,\n")
    with pytest.raises(LayoutError, match="line 2"):
        read_val_labels(tmp_path / "empty.csv")
    with pytest.raises(LayoutError, match="does not exist; pass --val-csv"):
        read_val_labels(tmp_path / "missing.csv")
