"""`invoke bench train`: trainkit's throughput against the bare loop a user would write, on this machine.

Each repeat runs the job through `invoke train` (local target, the same code path as any run) and then the bare
FSDP2 reference (training/bench/reference.py) on the run folder trainkit prepared: same model, data, batch and
precision, the same number of processes. Repeats alternate (trainkit, reference, trainkit, ...) so a machine's
drift lands on both. Per run: the median over the steady steps (the first tenth, at least one step, left out:
start-up, allocator and kernel warm-up) of tokens/s, step time and its parts (input wait, optimizer, forward
and backward as the rest), MFU against the datasheet peak and, on a GPU, against the bf16 matmul peak measured
on it (training/bench/peak.py), and the peak memory. The ratio trainkit / reference per pair, with its median and
spread, is the figure to quote. Results: benchmarks/<model>-<device>.json.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from training.common.flops import TransformerShape, mfu, peak_tflops_for_device
from training.common.job import MODEL_CONFIG, SPEC_FILE

from . import hardware
from .errors import SpecError

TIMEOUT_S = 3600


def steady(steps: list[dict]) -> list[dict]:
    """The steps that count: all but the first tenth (at least the first step)."""
    skip = max(1, len(steps) // 10)
    if len(steps) <= skip:
        raise SpecError(f"{len(steps)} step(s) leave nothing to time after warm-up: raise --steps (at least 10)")
    return steps[skip:]


def wall_tokens_per_s(steps: list[dict]) -> float | None:
    """Tokens/s over the steady window by the wall clock (each record's `time`, taken after its step): what the
    step timer leaves out (logging, checkpoint checks, stop handling between steps) counts too."""
    counted = steady(steps)
    before = steps[len(steps) - len(counted) - 1]
    if any("time" not in s for s in (before, *counted)):
        return None
    tokens = sum(s["tokens_per_s"] * s["step_time_s"] for s in counted)
    return tokens / (counted[-1]["time"] - before["time"])


def summarise(steps: list[dict], world: int, flops_per_token: float, peaks: dict, peak_memory: int | None) -> dict:
    counted = steady(steps)

    def median(key: str) -> float:
        return statistics.median(s[key] for s in counted)

    tokens_per_s, step_s = median("tokens_per_s"), median("step_time_s")
    data_s, optimizer_s = median("data_wait_s"), median("optimizer_s")
    return {
        "steps_timed": len(counted),
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_device": tokens_per_s / world,
        "tokens_per_s_wall": wall_tokens_per_s(steps),
        "step_time_s": step_s,
        "breakdown_s": {
            "input_wait": data_s,
            "forward_backward": statistics.median(
                s["step_time_s"] - s["data_wait_s"] - s["optimizer_s"] for s in counted
            ),
            "optimizer": optimizer_s,
            "exposed_communication": None,  # not separated: FSDP's collectives overlap forward and backward
        },
        "mfu_datasheet": mfu(tokens_per_s, flops_per_token, world, peaks["datasheet"]) if peaks["datasheet"] else None,
        "mfu_measured": mfu(tokens_per_s, flops_per_token, world, peaks["measured"]) if peaks["measured"] else None,
        "peak_memory_bytes": peak_memory,
        "first_loss": steps[0]["loss"],
        "last_loss": steps[-1]["loss"],
    }


def _run(command: list[str], log: Path, env: dict | None = None, timeout_s: float = TIMEOUT_S) -> None:
    """Run to the end; on a timeout the whole process group goes (torchrun's workers hold the GPUs)."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
    if code:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise SpecError(f"`{' '.join(command[:6])} ...` failed (exit {code}); end of {log}:\n{tail}")
    if code is None:
        raise SpecError(f"`{' '.join(command[:6])} ...` ran past {timeout_s:.0f} s and was stopped; its log: {log}")


def run_trainkit(flags: list[str], runs: Path, run_id: str) -> tuple[Path, list[dict], int]:
    """The job through `invoke train`: (run folder, its per-step records, peak memory)."""
    command = [sys.executable, "-m", "trainkit", "train", *flags, "--runs-dir", str(runs), "--run-id", run_id]
    _run([*command, "--metrics-port", "0"], runs / f"{run_id}.log")
    run = runs / run_id
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if "optimizer_s" in r and r.get("optimizer_s") is not None]
    if not steps:
        raise SpecError(f"{run}/metrics.jsonl has no timed steps (log every step: the bench passes --log-interval 1)")
    return run, steps, max(r["peak_memory_bytes"] for r in steps)


def run_reference(run: Path, nproc: int, out: Path) -> dict:
    env = dict(os.environ)
    if not hardware.local_gpu_count():  # as the local backend sets it for trainkit's processes
        env.setdefault("OMP_NUM_THREADS", str(max(1, hardware.local_cpu_count() // nproc)))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    command += ["-m", "training.bench.reference", "--spec", str(run / SPEC_FILE), "--out", str(out)]
    _run(command, out.with_suffix(".log"), env)
    return json.loads(out.read_text())


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


def precheck(flags: list[str]) -> None:
    """What the reference cannot run, refused before the first run: a vision model, a strategy other than FSDP2's."""
    from .job.models import get_model

    given = {flag: value for flag, value in zip(flags, [*flags[1:], ""], strict=True) if flag.startswith("--")}
    model = given.get("--model", "llama2-tiny")
    if get_model(model).family == "vision":
        raise SpecError(f"--model {model}: the bare reference is the language-model loop; vision is not benched yet")
    sharding = given.get("--sharding")
    if sharding and sharding not in ("FULL_SHARD", "SHARD_GRAD_OP"):
        raise SpecError(f"--sharding {sharding}: the bare reference shards with FSDP2 (FULL_SHARD or SHARD_GRAD_OP)")


def job_shape(spec: dict, config: dict) -> tuple[int, float]:
    """(processes, training FLOPs per token) of a run from its spec.json and model config."""
    world = spec["parallelism"]["nodes"] * spec["parallelism"]["nproc"]
    shape = TransformerShape.from_hf_config(SimpleNamespace(**config))
    return world, shape.flops_per_token(spec["data"]["seq_len"])


def make_record(
    flags: list[str], env: dict, peaks: dict, spec: dict, config: dict, precision: str, ours: list, theirs: list
) -> dict:
    """The results file's content: the machine, the job, both sides' summaries per repeat and the ratios."""
    world, flops = job_shape(spec, config)
    ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(ours, theirs, strict=True)]
    walls = [
        a["tokens_per_s_wall"] / b["tokens_per_s_wall"]
        for a, b in zip(ours, theirs, strict=True)
        if a.get("tokens_per_s_wall") and b.get("tokens_per_s_wall")
    ]
    return {
        "what": "invoke bench train: trainkit (invoke train, local) against the bare FSDP2 loop of "
        "training/bench/reference.py on the same run folder; medians over the steady steps of each run",
        "measured": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "invoke bench train " + " ".join(flags),
        **env,
        "job": {
            "model": spec["model"]["name"],
            "layers": config["num_hidden_layers"],
            "seq_len": spec["data"]["seq_len"],
            "global_batch_size": spec["optimisation"]["global_batch_size"],
            "micro_batch_size": spec["optimisation"]["micro_batch_size"],
            "processes": world,
            "precision": precision,
            "sharding": spec["parallelism"]["sharding"],
            "steps": spec["optimisation"]["steps"],
            "flops_per_token": flops,
        },
        "peak_tflops": {"datasheet_bf16": peaks["datasheet"], "measured_bf16_matmul": peaks["measured"]},
        "trainkit": ours,
        "reference": theirs,
        # per pair, on the median step's tokens/s, and on the steady window's wall-clock tokens/s (the fairer one:
        # it includes what each loop does between steps)
        "ratio": {"pairs": ratios, "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "ratio_wall": {
            "pairs": walls,
            "median": statistics.median(walls) if walls else None,
            "min": min(walls) if walls else None,
            "max": max(walls) if walls else None,
        },
    }


def bench(flags: list[str], repeats: int, output: str | None, workdir: str | None = None) -> tuple[Path, list[str]]:
    """Run the pairs, write the results file; returns (its path, lines to print)."""
    import tempfile

    if repeats < 1:
        raise SpecError(f"--repeats {repeats}: at least 1")
    precheck(flags)
    env = environment()
    runs = Path(workdir or tempfile.mkdtemp(prefix="trainkit-bench-"))
    runs.mkdir(parents=True, exist_ok=True)
    peaks = {"datasheet": peak_tflops_for_device(env["device"]["name"]), "measured": measured_peak()}
    ours, theirs, lines = [], [], []
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())  # a reused --workdir keeps its earlier runs
    for repeat in range(repeats):
        run, steps, memory = run_trainkit([*flags, "--log-interval", "1"], runs, f"bench-{stamp}-{repeat}")
        spec = json.loads((run / SPEC_FILE).read_text())
        config = json.loads((run / MODEL_CONFIG).read_text())
        world, flops = job_shape(spec, config)
        ours.append(summarise(steps, world, flops, peaks, memory))
        for weights in ("checkpoints", "model"):  # a bench needs the metrics and logs, not GBs of weights
            shutil.rmtree(run / weights, ignore_errors=True)
        reference = run_reference(run, spec["parallelism"]["nproc"], runs / f"reference-{stamp}-{repeat}.json")
        theirs.append(summarise(reference["steps"], world, flops, peaks, reference["peak_memory_bytes"]))
        ratio = ours[-1]["tokens_per_s_wall"] / theirs[-1]["tokens_per_s_wall"]
        lines.append(
            f"pair {repeat + 1}: trainkit {ours[-1]['tokens_per_s_wall']:,.0f} tok/s, reference "
            f"{theirs[-1]['tokens_per_s_wall']:,.0f} tok/s (steady window, wall clock), ratio {ratio:.3f}"
        )
    record = make_record(flags, env, peaks, spec, config, reference["precision"], ours, theirs)
    ratios = record["ratio_wall"]["pairs"]
    model = spec["model"]["name"]
    path = Path(output or f"benchmarks/{model}-{device_slug(env)}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    spread = f"{min(ratios):.3f}-{max(ratios):.3f}" if len(ratios) > 1 else "one pair"
    lines.append(
        f"trainkit / reference (wall clock): {statistics.median(ratios):.3f} (median of {len(ratios)}; {spread}) on "
        f"{env['device']['name']} x {record['job']['processes']} processes"
    )
    lines.append(f"results: {path} (runs and logs in {runs})")
    return path, lines
