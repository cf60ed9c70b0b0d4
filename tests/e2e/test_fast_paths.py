"""The FSDP2 fast paths (training/llm/fast_paths.py): each taken, and each holding the plain path's losses on CPU.

Per path, in one torchrun of two processes (tests/helpers/fast_paths_check.py: the trainer's own pieces on a small
Llama): what the prepared model holds, and its losses beside the plain path's. Then the trainer itself: one
`invoke train` with every fast path on under bf16 with fp32 gradient reduction, its summary reporting what its
model held, its losses within bf16's rounding of the session's plain run.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO
from tests.helpers.product import invoke, only_run_dir, read_jsonl


@pytest.fixture(scope="module")
def paths():
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*command, "-m", "tests.helpers.fast_paths_check"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_each_fast_path_is_taken(paths):
    plain = paths["plain"]["taken"]
    assert plain["checkpointed_layers"] == [] and plain["reshard_after_forward"] == [True] * 4
    assert plain["forward_prefetch"] == [0] * 4 and plain["param_dtype"] is None  # fp32: no policy
    assert paths["selective_ac"]["taken"]["checkpointed_layers"] == [0, 2]  # every 2nd of 4 layers
    assert paths["prefetch"]["taken"]["forward_prefetch"] == [2, 2, 1, 0]  # the next two, fewer at the end
    assert paths["prefetch"]["taken"]["backward_prefetch"] == [0, 1, 2, 2]
    assert paths["last_layer_kept"]["taken"]["reshard_after_forward"] == [True, True, True, False]
    # the kernel the passes were pinned to: sdpa_kernel(FLASH_ATTENTION) raises where flash cannot run, so a
    # finished run with it pinned ran flash
    assert paths["flash"]["taken"]["attention"] == "flash"
    assert paths["math_checkpointed"]["taken"]["checkpointed_layers"] == [0, 1, 2, 3]
    assert plain["attention_implementation"] == "sdpa"  # the pinned kernels bind: the model calls SDPA
    assert (paths["bf16"]["taken"]["param_dtype"], paths["bf16"]["taken"]["reduce_dtype"]) == ("bfloat16", "float32")
    bf16_reduce = paths["bf16_reduce"]["taken"]
    assert (bf16_reduce["param_dtype"], bf16_reduce["reduce_dtype"]) == ("bfloat16", "bfloat16")
    assert (plain["optimizer_kernel"], paths["fused_adamw"]["taken"]["optimizer_kernel"]) == ("foreach", "fused")
    # every layer compiled in place, and dynamo really built graphs for them (none on the plain path)
    assert (plain["compiled_layers"], paths["compiled"]["taken"]["compiled_layers"]) == ([], [0, 1, 2, 3])
    assert plain["graphs_compiled"] == 0 and paths["compiled"]["taken"]["graphs_compiled"] == 1  # shared by the four


def test_each_fast_path_keeps_the_plain_paths_losses(paths):
    plain = paths["plain"]["losses"]
    for name in ("selective_ac", "prefetch", "last_layer_kept"):  # the same arithmetic, in another order or time
        assert paths[name]["losses"] == plain, name
    for name in ("flash", "math_checkpointed", "fused_adamw", "compiled"):  # other kernels: fp32 rounding only
        assert paths[name]["losses"] == pytest.approx(plain, abs=1e-5), name
    # bf16 compute: within bf16's rounding of fp32; bf16 reductions within that of fp32 ones
    assert paths["bf16"]["losses"] == pytest.approx(plain, abs=2e-3)
    assert paths["bf16_reduce"]["losses"] == pytest.approx(paths["bf16"]["losses"], abs=2e-3)


def _losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl")}


def test_the_trainer_takes_every_fast_path_and_trains_within_bf16_rounding_of_the_plain_run(tiny_run, tmp_path):
    """One `invoke train` with every fast path on, under bf16 with bf16 reductions (each exact path's equality
    with the plain path is the per-path test's; one run here keeps the suite short)."""
    flags = ["--steps", "4", "--metrics-port=0", "--activation-checkpointing", "true", "--ac-every", "2"]
    flags += ["--prefetch", "1", "--reshard-last-layer", "false", "--attention", "flash", "--packing", "concat"]
    flags += ["--precision", "bf16", "--reduce-dtype", "bf16", "--fused-adamw", "true", "--compile", "true"]
    result = invoke("train", "--runs-dir", str(tmp_path), *flags)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    taken = json.loads((run_dir / "summary.json").read_text())["fast_paths"]
    layers = json.loads((run_dir / "model_config.json").read_text())["num_hidden_layers"]
    assert layers == 4  # llama2-tiny
    assert taken["checkpointed_layers"] == [0, 2] and taken["attention"] == "flash"
    assert taken["attention_implementation"] == "sdpa" and taken["optimizer_kernel"] == "fused"
    assert taken["compiled_layers"] == [0, 1, 2, 3] and taken["graphs_compiled"] >= 1  # the compiler ran
    assert taken["forward_prefetch"] == [1, 1, 1, 0] and taken["backward_prefetch"] == [0, 1, 1, 1]
    assert taken["reshard_after_forward"] == [True, True, True, False]
    assert (taken["param_dtype"], taken["reduce_dtype"]) == ("bfloat16", "bfloat16")
    plain, fast = _losses(tiny_run), _losses(run_dir)
    for step in range(1, 5):  # warm-up steps: the learning rate does not depend on the run's length
        assert fast[step] == pytest.approx(plain[step], abs=2e-2), (step, fast[step], plain[step])
