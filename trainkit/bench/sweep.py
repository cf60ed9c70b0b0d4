"""`python -m trainkit.bench.sweep`: which fast-path option pays on this machine, one run each.

`invoke bench train` answers "how far is trainkit from the bare loop" and runs pairs; this answers "which of
trainkit's own switches makes it faster here" with one trainkit run per variant on the same job (no reference,
no profiled steps): the plain job, then each switch alone (--compile, --attention flash, --prefetch,
--reduce-dtype bf16, activation checkpointing), then every switch that beat the plain run by more than
`--margin` together. A variant that fails is recorded with its error, not fatal: `--attention flash` refuses
where FlashAttention cannot run. Each run's figures are the steady-step medians of `invoke bench train`
(trainkit/bench/record.py). Results: one JSON file, written after every run, so a sweep cut short keeps what it
measured.

Variants are measured against the flags given, a variant's own flag replacing a given one. On a GPU the Llama 2
recipes already compile and recompute every 2nd layer (training/recipes.py, from this sweep's results); add
`--compile false --ac-every 1` for the baseline those defaults were chosen against.

Example (the GPU backlog's item 1):
    python -m trainkit.bench.sweep --out benchmarks/llama2-7b-sweep-h200.json -- \\
        --model llama2-7b --layers 4 --seq-len 2048 --steps 8 --compile false --ac-every 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from training.common.flops import peak_tflops_for_device
from training.families import family_of
from training.spec import MODEL_CONFIG, SPEC_FILE
from trainkit.bench.record import environment, job_shape, measured_peak, summarise
from trainkit.bench.train import flag_values, precheck, run_trainkit, without
from trainkit.errors import SpecError

# Each switch alone, as `invoke train` flags (training/spec/ has their meaning).
VARIANTS = {
    "compile": ["--compile", "true"],
    "flash": ["--attention", "flash"],
    "prefetch-1": ["--prefetch", "1"],
    "reduce-bf16": ["--reduce-dtype", "bf16"],
    "ac-every-2": ["--activation-checkpointing", "true", "--ac-every", "2"],
}


def combined(results: dict, margin: float) -> list[str]:
    """The flags of every variant whose rate beat the plain run's by more than `margin` (a fraction)."""
    plain = results.get("plain", {}).get("tokens_per_s")
    if not plain:
        return []
    flags = []
    for name, extra in VARIANTS.items():
        rate = results.get(name, {}).get("tokens_per_s")
        if rate and rate > plain * (1 + margin):
            flags += extra
    return flags


def variant_command(flags: list[str], extra: list[str]) -> list[str]:
    """The given flags with a variant's: its own flags replace given ones (invoke refuses a flag twice)."""
    own = tuple(word for word in extra if word.startswith("--"))
    return [*without(flags, own), *extra, "--log-interval", "1"]


def sweep(flags: list[str], out: Path, margin: float, only: list[str] | None = None) -> dict:
    family = precheck(flags)
    if not family_of(family).fsdp2:
        raise SpecError("the sweep's switches are the language models' (FSDP2, attention, compile)")
    env = environment()
    peaks = {"datasheet": peak_tflops_for_device(env["device"]["name"]), "measured": measured_peak()}
    runs = Path(tempfile.mkdtemp(prefix="trainkit-sweep-"))
    record = {
        "what": "trainkit's switches one at a time, then the winners together: one invoke train run each, "
        "steady-step medians (trainkit/bench/sweep.py)",
        "measured": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": " ".join(["python -m trainkit.bench.sweep --", *flags]),
        **env,
        "peak_tflops": {"datasheet_bf16": peaks["datasheet"], "measured_bf16_matmul": peaks["measured"]},
        "margin": margin,
        "variants": {},
    }
    plan = {"plain": [], **VARIANTS}
    if only:
        plan = {name: plan[name] for name in only}

    def run(name: str, extra: list[str]) -> None:
        started = time.monotonic()
        entry: dict = {"flags": extra}
        try:
            folder, steps, memory = run_trainkit(variant_command(flags, extra), runs, f"sweep-{name}")
            spec = json.loads((folder / SPEC_FILE).read_text())
            world, per_token = job_shape(spec, json.loads((folder / MODEL_CONFIG).read_text()))
            entry.update(summarise(steps, world, per_token, peaks, memory, family))
            for weights in ("checkpoints", "model"):  # each run would leave GBs behind (the disk check refuses)
                shutil.rmtree(folder / weights, ignore_errors=True)
        except SpecError as error:
            entry["error"] = str(error).splitlines()[0][:300]
        entry["wall_s"] = round(time.monotonic() - started, 1)
        record["variants"][name] = entry
        out.write_text(json.dumps(record, indent=2) + "\n")
        rate = entry.get("tokens_per_s")
        mfu = entry.get("mfu_datasheet")
        shown = f"{rate:,.0f} tokens/s" + (f", MFU {mfu:.1%}" if mfu else "") if rate else entry.get("error")
        print(f"{name}: {shown} ({entry['wall_s']} s)", flush=True)

    for name, extra in plan.items():
        run(name, extra)
    best = combined(record["variants"], margin)
    if len([f for f in best if f.startswith("--")]) > 1:
        run("combined", best)
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--margin", type=float, default=0.01, help="a switch counts as a win above this fraction")
    parser.add_argument("--only", default="", help="comma list of variants (plain, " + ", ".join(VARIANTS) + ")")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="-- then invoke train's flags")
    args = parser.parse_args(argv)
    flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    if "--steps" not in flag_values(flags):
        flags += ["--steps", "10"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        sweep(flags, args.out, args.margin, [n for n in args.only.split(",") if n] or None)
    except SpecError as error:
        sys.exit(f"sweep: {error}")


if __name__ == "__main__":
    main()
