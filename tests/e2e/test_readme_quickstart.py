"""README's "Five minutes on this machine", as a new user reads it: what `make train MODEL=llama2-tiny` prints has
the shape the README shows (the session's own run of that command), and the commands shown after it run as
written against that run. The training commands in the same block run in their own tests (a second ImageNet, user
script or elastic job here would cost minutes for nothing new): tests/e2e/test_vision_train.py,
tests/e2e/test_user_script.py and tests/e2e/test_elastic_local.py."""

from __future__ import annotations

import re

from tests.helpers.paths import REPO
from tests.helpers.product import invoke_in

SECTION = "## Five minutes on this machine"
PLACEHOLDER = re.compile(r"<(hash|first|last|n)>")
# The session's run lives outside ./runs, so the commands the summary suggests name its --runs-dir after the run id.
VALUES = {"hash": r"[0-9a-f]+(?: --runs-dir \S+)?", "first": r"[0-9.]+", "last": r"[0-9.]+", "n": r"[0-9.,]+"}
TRAINS = ("invoke train --model", "invoke run ", "invoke train --nodes")  # run in their own tests (above)


def blocks() -> list[list[str]]:
    """The section's indented blocks, each a list of its lines without the indent."""
    text = (REPO / "README.md").read_text().partition(SECTION)[2].partition("\n## ")[0]
    found, current = [], []
    for line in text.splitlines():
        if line.startswith("    "):
            current.append(line[4:])
        elif current and line.strip():
            found.append(current)
            current = []
    return [*found, current] if current else found


def shape(line: str, runs: str) -> re.Pattern:
    """A README output line as a pattern: placeholders take any value, `runs/` is where the session's run lives."""
    parts = PLACEHOLDER.split(line.replace("runs/", f"{runs}/").rstrip())
    pattern = "".join(VALUES[part] if i % 2 else re.escape(part) for i, part in enumerate(parts))
    return re.compile(rf"^{pattern}$")


def test_make_train_prints_what_the_readme_shows(tiny_make_train):
    run_dir, result = tiny_make_train
    printed = [line.rstrip() for line in result.stdout.splitlines()]
    shown = [line for line in blocks()[0] if not line.startswith("...")]
    assert len(shown) >= 5
    missing = [line for line in shown if not any(shape(line, str(run_dir.parent)).match(p) for p in printed)]
    assert missing == [], "\n".join(printed[-20:])


def test_the_commands_after_it_run_as_written(tiny_run, tmp_path):
    (tmp_path / "runs").symlink_to(tiny_run.parent)  # the README's commands read ./runs
    commands = [line.split("#")[0].split() for line in blocks()[1]]
    ran = []
    for words in commands:
        line = " ".join(words)
        if line.startswith(TRAINS):
            continue
        assert words[0] == "invoke", line
        done = invoke_in(tmp_path, *words[1:])
        ran.append((line, done.returncode, done.stdout + done.stderr))
    assert [line for line, _, _ in ran] == [
        "invoke status",
        "invoke logs --rank 1",
        "invoke stop",
        "invoke plan --model llama2-70b --nodes 16",
        "invoke train --help",
    ]
    # A finished run has nothing to stop, and `invoke stop` says so (exit 2, as for any request it cannot do).
    assert [code for _, code, _ in ran] == [0, 0, 2, 0, 0], ran
    status, logs, stop, plan, helped = (out for _, _, out in ran)
    assert tiny_run.name in status and "finished" in status
    assert logs.strip() and "Usage: invoke" not in logs
    assert f"run {tiny_run.name} is not running on this machine; nothing to stop" in stop
    assert "llama2-70b" in plan and "Usage:" in helped and "--model" in helped
