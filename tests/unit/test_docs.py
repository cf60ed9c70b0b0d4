"""The README keeps its two set-up commands at the top; the generated pages (docs/generate.py) are current and name
every train flag and metric."""

from __future__ import annotations

import re
import runpy

from tests.helpers.paths import REPO
from training.spec import fields_of

README = (REPO / "README.md").read_text()


def test_readme_opens_with_exactly_the_two_setup_commands():
    commands = [line.split("#")[0].strip() for line in README.splitlines()[2:4]]
    assert commands == ["make train MODEL=llama2-tiny", "make test"]


def test_the_generated_pages_are_current():
    generator = runpy.run_path(str(REPO / "docs" / "generate.py"))
    assert generator["changed"](write=False) == [], "run `make docs` (python docs/generate.py) and commit the result"


def test_every_train_flag_is_in_the_command_reference():
    reference = (REPO / "docs" / "reference" / "commands.md").read_text()
    train = reference.partition("## `invoke train`")[2].partition("\n## ")[0]
    missing = [spec.flag for spec in fields_of(cli=True) if f"`{spec.flag}`" not in train]
    assert not missing, missing


def test_every_exported_metric_is_in_the_metrics_contract():
    from training.common.metrics import GAUGES

    contract = (REPO / "observability" / "README.md").read_text()
    missing = [name for name in GAUGES if f"`{name}`" not in contract]
    assert not missing, missing


# What a measured figure looks like in prose: a rate, a time in milliseconds, or an approximate duration. The pages
# take such figures from the results files (docs/generate.py renders them into docs/generated/), never typed.
MEASURED = re.compile(
    r"~\s?\d|\babout \d[\d,.]* ?(?:s|seconds|minutes|min)\b|\d[\d,.]* ?(?:tokens/s|images/s|samples/s|TFLOP/s)|"
    r"\d ?ms\b"
)


def typed_figures(text: str) -> list[str]:
    """The lines of a hand-written page, outside its indented and fenced code, that carry a measured figure."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or line.startswith("    ") or line.startswith("<!-- generated"):
            continue
        if MEASURED.search(line):
            found.append(line.strip())
    return found


def test_no_measured_figure_is_typed_by_hand_into_the_docs():
    pages = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
    typed = {page.name: typed_figures(page.read_text()) for page in pages}
    assert not {name: lines for name, lines in typed.items() if lines}, (
        "render them from benchmarks/ (docs/generate.py)"
    )


def test_the_typed_figure_check_finds_one():
    planted = "On this machine it ran at 2,377 tokens/s and took ~3 minutes.\n\n    12 ms in a code block\n"
    assert typed_figures(planted) == ["On this machine it ran at 2,377 tokens/s and took ~3 minutes."]


PAGE_ROW = re.compile(r"^\| (.+?) \| \[[^\]]+\]\(([^)]+)\) \|$", re.MULTILINE)


def test_the_site_home_and_the_readme_list_the_same_pages_and_every_page_in_the_nav():
    """docs/index.md takes the README's introduction as a snippet; the page tables differ only in their links'
    folder, so a page added to one and not the other (or not to mkdocs.yml's nav) fails here."""
    index = (REPO / "docs" / "index.md").read_text()
    readme = {title: link.removeprefix("docs/") for title, link in PAGE_ROW.findall(README)}
    readme["Contributing"] = readme["Contributing"].replace("CONTRIBUTING.md", "contributing.md")
    assert dict(PAGE_ROW.findall(index)) == readme
    nav = set(re.findall(r":\s+([\w/-]+\.md)$", (REPO / "mkdocs.yml").read_text(), re.MULTILINE))
    assert nav - {"index.md", "reference/commands.md", "reference/metrics.md"} == set(readme.values())
    for command in README.splitlines()[2:4]:
        assert command in index
