"""The chaos matrix (`invoke bench elastic`), in the background from early in the session
(tests/helpers/background.py): ~12 minutes on 2 cores on its own, one scenario at a time. tests/e2e/test_chaos.py
reads what it measured.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.helpers.background import Background
from tests.helpers.paths import BIN

MODULE = "e2e/test_chaos.py"  # relative to tests/
PARALLEL = 1  # scenarios at a time: beside the rest of the suite, one leaves the suite's own jobs a core and keeps
# the matrix's recoveries well inside their budget; it still ends before the suite does


def start() -> Background:
    command = [str(BIN / "invoke"), "bench", "elastic", "--output", "{root}/elastic.json", "--table"]
    return Background(
        "elastic-bench", [*command, "{root}/elastic-table.md", "--parallel", str(PARALLEL)], timeout_s=2400
    )


def result(bench: Background) -> tuple[subprocess.CompletedProcess, dict | None, Path]:
    """(the command's result, the benchmark record it wrote or None, the table file it wrote)."""
    done = bench.result()
    output = bench.root / "elastic.json"
    return done, json.loads(output.read_text()) if output.exists() else None, bench.root / "elastic-table.md"
