"""`invoke bench runs`: the commands the docs quote, each run once on this machine through `invoke train` and
recorded in benchmarks/runs-<device>.json, so that what a page says a command does here (its time, its rate, what
it writes) comes from a run of it; docs/generate.py renders the pages' figures from the file.

Per command: the whole command's wall time, the medians summary.json keeps, the final evaluation, and the bytes
it wrote (the newest checkpoint and the export) beside what the launcher's disk check predicted for them
(trainkit/run/storage.py).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from training.common.checkpoint import CHECKPOINTS_DIR, complete_steps
from training.spec import SPEC_FILE, read_job
from training.spec.run_folder import MERGED_DIR
from trainkit.bench.record import device_slug, environment
from trainkit.bench.train import run_trainkit
from trainkit.errors import SpecError
from trainkit.job.models import get_model
from trainkit.run.storage import storage_need

# name -> (where the docs quote it, the flags of `invoke train`)
RUNS: dict[str, tuple[str, list[str]]] = {
    "resnet-tiny": ("docs/vision.md: the vision quickstart", ["--model", "resnet-tiny"]),
    "llama2-7b-2-layers": (
        "docs/quickstart.md and docs/checkpoints.md: the true 7B layer shapes, truncated",
        [
            "--model",
            "llama2-7b",
            "--init",
            "random",
            "--layers",
            "2",
            "--seq-len",
            "128",
            "--steps",
            "5",
            "--nproc",
            "2",
        ],
    ),
    # docs/lora.md: a checkpoint and an export of LoRA against a full fine-tune's, the second run adapting the weights
    # the first exported ({runs}: the bench's runs folder)
    "llama2-tiny-full": (
        "docs/lora.md: the full fine-tune LoRA is held against",
        ["--model", "llama2-tiny", "--steps", "20"],
    ),
    "llama2-tiny-lora": (
        "docs/lora.md: a LoRA checkpoint and export against the full fine-tune's",
        [
            "--model",
            "llama2-tiny",
            "--steps",
            "20",
            "--init",
            "pretrained",
            "--weights",
            "{runs}/llama2-tiny-full/model",
        ]
        + ["--lora-rank", "8", "--export", "merged"],
    ),
}
SUMMARY_KEYS = (
    "steps",
    "first_loss",
    "last_loss",
    "tokens_per_s_median",
    "samples_per_s_median",
    "step_time_s_median",
    "epoch_time_s_median",
    "final_eval",
)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def written(run: Path) -> dict:
    """What the run left on disk (the newest checkpoint, the export) and what the disk check predicted."""
    job = read_job(run / SPEC_FILE)
    need = storage_need(job, get_model(job.model.name))
    steps = complete_steps(run / CHECKPOINTS_DIR)
    exports = [folder for folder in (run / "model", run / MERGED_DIR) if folder.is_dir()]
    said = {
        "parameters": need.parameters,
        "checkpoint_bytes": folder_bytes(steps[-1]) if steps else None,
        "checkpoint_bytes_predicted": need.checkpoint_bytes,
        "export_bytes": sum(folder_bytes(folder) for folder in exports) if exports else None,
        "export_bytes_predicted": need.export_bytes or None,
    }
    if need.trained is not None:  # LoRA: the adapters' weights alone, as PEFT saved them
        said |= {"trained": need.trained, "adapter_bytes": (run / "model" / "adapter_model.safetensors").stat().st_size}
    return said


def record_one(name: str, runs: Path) -> dict:
    quoted, flags = RUNS[name]
    started = time.monotonic()
    run, _steps, _memory = run_trainkit([flag.format(runs=runs) for flag in flags], runs, name)
    wall = time.monotonic() - started
    summary = json.loads((run / "summary.json").read_text())
    return {
        "command": "invoke train " + " ".join(flag.format(runs="runs") for flag in flags),
        "quoted_in": quoted,
        "command_wall_s": round(wall, 1),
        "world_size": read_job(run / SPEC_FILE).parallelism.nproc,
        **{key: summary.get(key) for key in SUMMARY_KEYS},
        **written(run),
    }


def bench(output: str | None, names: list[str] | None = None, workdir: str | None = None) -> tuple[Path, dict]:
    """Run the commands (all, or `names`) one after another; write (or update) the results file."""
    unknown = sorted(set(names or ()) - set(RUNS))
    if unknown:
        raise SpecError(f"--only {','.join(unknown)}: no such run; choose from: {', '.join(RUNS)}")
    env = environment()
    path = Path(output or f"benchmarks/runs-{device_slug(env)}.json")
    record = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
    runs = Path(workdir or tempfile.mkdtemp(prefix="trainkit-bench-runs-"))
    runs.mkdir(parents=True, exist_ok=True)
    for name in names or RUNS:
        print(f"running {name}: invoke train {' '.join(RUNS[name][1])}", flush=True)
        record["runs"][name] = {**record_one(name, runs), "measured": time.strftime("%Y-%m-%d", time.gmtime())}
    record.update(
        what="the commands the docs quote, each run once through invoke train (trainkit/bench/runs.py)",
        device=env["device"],
        versions=env["versions"],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path, record
