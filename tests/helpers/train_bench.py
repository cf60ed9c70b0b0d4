"""One `invoke bench train` pair on CPU for llama2-tiny, one for resnet-tiny and one for llama2-tiny with LoRA, in
the background from early in the session (tests/helpers/background.py): ~35 s + ~40 s + ~35 s on 2 cores on their
own, mostly process start-ups.
tests/e2e/test_bench_train.py reads what they wrote.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from tests.helpers.background import Background
from tests.helpers.paths import BIN

MODULE = "e2e/test_bench_train.py"  # relative to tests/
WRITE_BASE = "from pathlib import Path; from tests.helpers.tiny_decoders import write_pretrained"


def start() -> Background:
    """The language-model pair, then the vision one (trainkit on JPEGs, the DDP reference, trainkit on-device)."""
    bench = [str(BIN / "invoke"), "bench", "train", "--steps", "6", "--repeats", "1"]
    llm = [*bench, "--model", "llama2-tiny", "--output", "{root}/bench.json", "--workdir", "{root}/runs"]
    vision = [*bench, "--model", "resnet-tiny", "--output", "{root}/vision.json", "--workdir", "{root}/vision-runs"]
    # LoRA (issue 53): a pretrained llama2-tiny folder made here, adapted on both sides
    base = [sys.executable, "-c", f"{WRITE_BASE}; write_pretrained(Path('{{root}}/base'), 'llama2-tiny', seed=1)"]
    lora = [*bench, "--model", "llama2-tiny", "--init", "pretrained", "--weights", "{root}/base", "--lora-rank", "8"]
    lora += ["--output", "{root}/lora.json", "--workdir", "{root}/lora-runs"]
    script = " && ".join(shlex.join(command) for command in (llm, vision, base, lora))
    return Background("train-bench", ["bash", "-c", script], 1200)


def result(bench: Background) -> tuple[subprocess.CompletedProcess, Path]:
    """(both commands' result, their folder: bench.json and runs/, vision.json and vision-runs/)."""
    return bench.result(), bench.root
