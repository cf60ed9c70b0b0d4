"""What `invoke bench train` measured, as numbers and as a record: the steady steps of a run and their medians, the
machine and versions it ran on, the job's shape and FLOPs, and benchmarks/<model>-<device>.json's record of trainkit
beside the bare reference (train.py runs them)."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from training.common.flops import mfu
from training.families import family_of, launcher_hook
from training.spec import Job
from trainkit import hardware
from trainkit.errors import SpecError


def warmup_steps(total: int) -> int:
    """Steps left out of the timings at the start: the first tenth, at least one."""
    return max(1, total // 10)


def profile_window(total: int) -> str:
    """TRAINKIT_PROFILE_STEPS for trainkit's runs: the two steps after warm-up, left out of the timings as well."""
    first = warmup_steps(total) + 1
    return f"{first}:{first + 1}"


def steady(steps: list[dict]) -> list[dict]:
    """The steps that count: all but the first tenth (at least the first step) and the profiled steps after it."""
    counted = steps[warmup_steps(len(steps)) :]
    while counted and counted[0].get("profiled"):
        counted = counted[1:]
    if not counted:
        raise SpecError(f"{len(steps)} step(s) leave nothing to time after warm-up: raise --steps (at least 10)")
    return counted


def wall_rate(steps: list[dict], key: str = "tokens_per_s") -> float | None:
    """Tokens (or images) per second over the steady window by the wall clock (each record's `time`, taken after
    its step): what the step timer leaves out (logging, checkpoint checks, stop handling between steps) counts."""
    counted = steady(steps)
    before = steps[len(steps) - len(counted) - 1]
    if any("time" not in s for s in (before, *counted)):
        return None
    done = sum(s[key] * s["step_time_s"] for s in counted)
    return done / (counted[-1]["time"] - before["time"])


def summarise(
    steps: list[dict],
    world: int,
    flops_per_item: float,
    peaks: dict,
    peak_memory: int | None,
    family: str = "decoder",
    profile: dict | None = None,
) -> dict:
    """One run's steady-state figures; `flops_per_item`: training FLOPs per token (or image); `profile`: the run's
    profiled steps (summary.json's, training/common/profiling.py), where it has them."""
    throughput = family_of(family).throughput
    key, unit = throughput.record, throughput.unit
    counted = steady(steps)

    def median(name: str) -> float:
        return statistics.median(s[name] for s in counted)

    rate, step_s = median(key), median("step_time_s")
    data_s, optimizer_s = median("data_wait_s"), median("optimizer_s")
    return {
        "steps_timed": len(counted),
        f"{unit}_per_s": rate,
        f"{unit}_per_s_per_device": rate / world,
        f"{unit}_per_s_wall": wall_rate(steps, key),
        "step_time_s": step_s,
        "breakdown_s": {
            "input_wait": data_s,
            "forward_backward": statistics.median(
                s["step_time_s"] - s["data_wait_s"] - s["optimizer_s"] for s in counted
            ),
            "optimizer": optimizer_s,
            # torch.profiler over two steps: collectives under no compute (None: not profiled, e.g. the reference)
            "exposed_communication": profile["exposed_communication_s"] if profile else None,
        },
        "communication_s": profile["communication_s"] if profile else None,
        "mfu_datasheet": mfu(rate, flops_per_item, world, peaks["datasheet"]) if peaks["datasheet"] else None,
        "mfu_measured": mfu(rate, flops_per_item, world, peaks["measured"]) if peaks["measured"] else None,
        "peak_memory_bytes": peak_memory,
        "first_loss": steps[0]["loss"],
        "last_loss": steps[-1]["loss"],
    }


def measured_peak() -> float | None:
    if not hardware.local_gpu_count():
        return None
    done = subprocess.run([sys.executable, "-m", "training.bench.peak"], capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SpecError(f"measuring the matmul peak failed: {done.stderr.strip()[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["tflops"]


def environment() -> dict:
    import accelerate
    import torch
    import transformers

    gpu = torch.cuda.is_available()
    name = torch.cuda.get_device_name() if gpu else f"{cpu_model()} ({hardware.local_cpu_count()} cores)"
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if gpu else None
    return {
        "device": {"name": name, "count": torch.cuda.device_count() if gpu else 1, "kind": "gpu" if gpu else "cpu"},
        "versions": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "nccl": nccl,
            "accelerate": accelerate.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def device_slug(env: dict) -> str:
    if env["device"]["kind"] == "cpu":
        return "cpu"
    known = [key for key in ("A100", "H100", "H200") if key in env["device"]["name"].upper()]
    return (known[0] if known else "gpu").lower()


def job_shape(spec: dict, config: dict) -> tuple[int, float]:
    """(processes, training FLOPs per counted item: token, image ...) of a run from its spec.json and model config,
    as its family counts them (its launcher side's `flops_per_item`)."""
    job = Job.from_dict(spec)
    family = family_of(job.model.family)
    count = launcher_hook(family, "flops_per_item")
    if count is None:
        raise SpecError(f"--model {job.model.name}: the {family.kind} family counts no FLOPs; the bench cannot time it")
    return job.world_size, count(job, config)


def _ratio(ours: list, theirs: list, key: str) -> dict:
    pairs = [a[key] / b[key] for a, b in zip(ours, theirs, strict=True) if a.get(key) and b.get(key)]
    if not pairs:
        return {"pairs": [], "median": None, "min": None, "max": None}
    return {"pairs": pairs, "median": statistics.median(pairs), "min": min(pairs), "max": max(pairs)}


def make_record(
    flags: list[str],
    env: dict,
    peaks: dict,
    spec: dict,
    config: dict,
    precision: str,
    ours: list,
    theirs: list,
    ceiling: list | None = None,
) -> dict:
    """The results file's content: the machine, the job, both sides' summaries per repeat and the ratios; for
    vision also the on-device runs (`ceiling`) and the JPEG pipeline's share of that ceiling."""
    world, flops = job_shape(spec, config)
    family = family_of(spec["model"]["family"])  # spec.json's: the launcher writes the family
    unit = family.throughput.unit
    job = {
        "model": spec["model"]["name"],
        "global_batch_size": spec["optimisation"]["global_batch_size"],
        "micro_batch_size": spec["optimisation"]["micro_batch_size"],
        "processes": world,
        "precision": precision,
        "sharding": spec["parallelism"]["sharding"],
        "steps": spec["optimisation"]["steps"],
    }
    if family.text:
        job |= {"layers": config["num_hidden_layers"], "seq_len": spec["data"]["seq_len"], "flops_per_token": flops}
    else:
        job |= {"image_size": spec["data"]["image_size"], "loader_workers": spec["data"]["loader_workers"]}
        job |= {f"flops_per_{unit.removesuffix('s')}": flops}
    lora = spec.get("lora") or {}
    if lora.get("rank"):  # both sides trained adapters; MFU counts 4 FLOPs a frozen weight (training/common/flops.py)
        job["lora"] = {key: lora[key] for key in ("rank", "alpha", "targets")}
    loop = "FSDP2" if family.fsdp2 else "DDP"
    reference = f"the bare {loop} loop of {str(family.bench_reference).replace('.', '/')}.py"
    record = {
        "what": f"invoke bench train: trainkit (invoke train, local) against {reference} on the same run folder; "
        "medians over the steady steps of each run",
        "measured": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "invoke bench train " + " ".join(flags),
        **env,
        "job": job,
        "peak_tflops": {"datasheet_bf16": peaks["datasheet"], "measured_bf16_matmul": peaks["measured"]},
        "trainkit": ours,
        "reference": theirs,
        # per pair, on the median step's rate, and on the steady window's wall-clock rate (it includes what each
        # loop does between steps)
        "ratio": _ratio(ours, theirs, f"{unit}_per_s"),
        "ratio_wall": _ratio(ours, theirs, f"{unit}_per_s_wall"),
    }
    if ceiling is not None:
        record["synthetic_input"] = ceiling
        # the input pipeline (vision: JPEG decode, augment, copy) against on-device input, per repeat: 1 - this is
        # its cost
        record["input_pipeline"] = _ratio(ours, ceiling, f"{unit}_per_s")
    return record
