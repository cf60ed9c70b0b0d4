"""The documentation site builds with `mkdocs build --strict` (mkdocs.yml): a broken link, a page left out of the
navigation or an include that names no file fails it, as a planted broken link shows."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers.paths import REPO

MKDOCS = str(Path(sys.executable).parent / "mkdocs")
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice of its end of life, printed on every build


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MKDOCS, "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=REPO,  # the includes name their files from the repository's root
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_site_builds_strictly_with_every_page_and_include(tmp_path):
    done = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    elastic = (tmp_path / "site" / "elastic" / "index.html").read_text()
    assert "node0-kill" in elastic  # the generated table, included
    assert not (tmp_path / "site" / "generate.py").exists() and not (tmp_path / "site" / "generated").exists()


def test_a_broken_link_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    (docs / "data.md").write_text((docs / "data.md").read_text() + "\nSee [the missing page](missing.md).\n")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 1 and "contains a link 'missing.md'" in done.stderr, done.stdout + done.stderr
