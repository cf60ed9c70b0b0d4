"""Stale pointers (tests/helpers/pointers.py): every repository path and module that docs, comments, error messages
and YAML comments name exists, and every flag written after `invoke TASK` is one that task takes."""

from __future__ import annotations

from tests.helpers.paths import REPO
from tests.helpers.pointers import stale_pointers, unknown_flags


def test_every_path_and_module_named_exists():
    assert stale_pointers(REPO) == []


def test_every_flag_named_after_an_invoke_command_is_one_it_takes():
    assert unknown_flags(REPO) == []


def test_the_checks_find_a_planted_wrong_path_module_and_flag(tmp_path):
    (tmp_path / "trainkit" / "backends").mkdir(parents=True)
    (tmp_path / "trainkit" / "__init__.py").write_text("")
    (tmp_path / "trainkit" / "backends" / "__init__.py").write_text("from .base import Backend\n")
    (tmp_path / "trainkit" / "backends" / "base.py").write_text("class Backend: ...\nLIMIT = 1\n")
    (tmp_path / "README.md").write_text(
        "See trainkit/backends/base.py and trainkit/render.py (moved).\n"
        "`trainkit.backends.base.LIMIT`, `trainkit.backends.Backend`, `trainkit.backends.base.GONE`, `trainkit.spec`\n"
        "Runs land in runs/<id>/ and labels under trainkit/pool; see trainkit/backends/ and run-<id>.\n"
        "An absence: no trainkit/bench.json, said so; but trainkit/bench.json named as if present.\n"
        "    invoke train --model x --no-such-flag   # a comment --ignored\n"
        "    invoke run --script a.py -- --epochs 3\n"
        "    invoke data.nothing --dest d\n"
    )
    files = [tmp_path / "README.md"]
    assert stale_pointers(tmp_path, files) == [
        "README.md:1: trainkit/render.py",
        "README.md:2: trainkit.backends.base.GONE",
        "README.md:2: trainkit.spec",
        "README.md:4: trainkit/bench.json",
    ]
    tasks = {"train": {"model", "dry-run"}, "run": {"script"}, "data.imagenet": {"dest"}}
    assert unknown_flags(tmp_path, files, tasks) == [
        "README.md:5: invoke train --no-such-flag",
        "README.md:7: invoke data.nothing (no such task)",
    ]
