"""One `invoke bench train` pair on CPU, in the background from the start of the session
(tests/helpers/background.py): ~40 s on 2 cores on its own, mostly process start-ups. tests/e2e/test_bench_train.py
reads what it wrote.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers.background import Background
from tests.helpers.paths import BIN

MODULE = "test_bench_train.py"


def start() -> Background:
    command = [str(BIN / "invoke"), "bench", "train", "--model", "llama2-tiny", "--steps", "10", "--repeats", "1"]
    return Background("train-bench", [*command, "--output", "{root}/bench.json", "--workdir", "{root}/runs"], 900)


def result(bench: Background) -> tuple[subprocess.CompletedProcess, Path]:
    """(the command's result, its folder: bench.json and runs/)."""
    return bench.result(), bench.root
