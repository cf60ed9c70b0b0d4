"""`invoke bench train`: trainkit's throughput against the bare loop a user would write, on this machine.

Each repeat runs the job through `invoke train` (local target, the same code path as any run) and then the bare
reference on the run folder trainkit prepared: same model, data, batch and precision, the same number of
processes — for language models the FSDP2 loop of training/bench/reference.py, for vision models the DDP loop of
training/bench/vision_reference.py (torchvision ImageFolder + DataLoader). For vision each repeat also runs
trainkit once more on synthetic on-device input (`--synthetic`: no decode, no host work, no copy), the compute
ceiling, and the input pipeline is judged as JPEG images/s over that ceiling. Repeats alternate (trainkit,
reference, trainkit, ...) so a machine's drift lands on both. Per run: the median over the steady steps (the
first tenth, at least one step, left out: start-up, allocator and kernel warm-up) of tokens (images)/s, step time
and its parts (input wait, optimizer, forward and backward as the rest), MFU against the datasheet peak and, on a
GPU, against the bf16 matmul peak measured on it (training/bench/peak.py), and the peak memory; trainkit's two
steps after warm-up run under torch.profiler, for the communication and the exposed part of it per step
(training/common/profiling.py), and are not timed. The ratio
trainkit / reference per pair, with its median and spread, is the figure to quote. Results:
benchmarks/<model>-<device>.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from training.common.files import read_jsonl
from training.common.flops import peak_tflops_for_device
from training.common.profiling import ENV as PROFILE_ENV
from training.families import FAMILIES, family_of
from training.spec import MODEL_CONFIG, SPEC_FILE, Job
from trainkit import hardware
from trainkit.bench.record import (
    device_slug,
    environment,
    job_shape,
    make_record,
    measured_peak,
    profile_window,
    summarise,
)
from trainkit.errors import SpecError
from trainkit.job.models import get_model

TIMEOUT_S = 3600
STOP_GRACE_S = 10  # an interrupted run's torchrun gets this long after SIGTERM to stop its workers


def _end_group(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the run's process group (torchrun passes it to its workers), then after `grace_s` SIGKILL to
    whatever of the group is left (a group outlives its leader while a member runs)."""
    if grace_s:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def stop_on_sigterm() -> None:
    """A SIGTERM to the bench ends it as Ctrl-C does, through its cleanup (Python's default would not run it)."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def _run(command: list[str], log: Path, env: dict | None = None, timeout_s: float = TIMEOUT_S) -> None:
    """Run to the end; on a timeout the whole process group goes (torchrun's workers hold the GPUs), and so it does
    when the bench itself is interrupted (Ctrl-C, or a SIGTERM, which `stop_on_sigterm` turns into SystemExit): the
    run has its own session, so nothing else would reach its workers."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _end_group(process, grace_s=0)
            code = None
        except BaseException:
            _end_group(process, grace_s=STOP_GRACE_S)
            print(f"bench stopped during `{' '.join(command[:6])} ...`; its log: {log}", file=sys.stderr, flush=True)
            raise
    if code:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise SpecError(f"`{' '.join(command[:6])} ...` failed (exit {code}); end of {log}:\n{tail}")
    if code is None:
        raise SpecError(f"`{' '.join(command[:6])} ...` ran past {timeout_s:.0f} s and was stopped; its log: {log}")


def run_trainkit(flags: list[str], runs: Path, run_id: str, profile: str | None = None) -> tuple[Path, list[dict], int]:
    """The job through `invoke train`: (run folder, its per-step records, peak memory); `profile`: the steps to
    profile (TRAINKIT_PROFILE_STEPS)."""
    command = [sys.executable, "-m", "trainkit", "train", *flags, "--runs-dir", str(runs), "--run-id", run_id]
    env = {**os.environ, PROFILE_ENV: profile} if profile else None
    _run([*command, "--metrics-port", "0"], runs / f"{run_id}.log", env)
    run = runs / run_id
    records = read_jsonl(run / "metrics.jsonl")
    steps = [r for r in records if "optimizer_s" in r and r.get("optimizer_s") is not None]
    if not steps:
        raise SpecError(f"{run}/metrics.jsonl has no timed steps (log every step: the bench passes --log-interval 1)")
    return run, steps, max(r["peak_memory_bytes"] for r in steps)


def model_config(run: Path, spec: dict) -> dict:
    """The model's config: the run folder's (random init), else the pretrained weights' own config.json."""
    if (run / MODEL_CONFIG).is_file():
        return json.loads((run / MODEL_CONFIG).read_text())
    weights = str(Job.from_dict(spec).model.weights)
    folder = Path(weights).expanduser()
    if (folder / "config.json").is_file():
        return json.loads((folder / "config.json").read_text())
    from transformers import AutoConfig  # a hub id: its config, from the cache the run's download filled

    return AutoConfig.from_pretrained(weights, token=os.environ.get("HF_TOKEN")).to_dict()


def run_reference(run: Path, nproc: int, out: Path, family: str = "decoder") -> dict:
    env = dict(os.environ)
    if not hardware.local_gpu_count():  # as the local backend sets it for trainkit's processes
        env.setdefault("OMP_NUM_THREADS", str(max(1, hardware.local_cpu_count() // nproc)))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    command += ["-m", family_of(family).bench_reference, "--spec", str(run / SPEC_FILE), "--out", str(out)]
    _run(command, out.with_suffix(".log"), env)
    return json.loads(out.read_text())


# What the on-device (--synthetic) run of the vision bench leaves out: it has no data to read and no loader to set.
NOT_ON_DEVICE = ("--dataset", "--pin-memory", "--persistent-workers", "--prefetch-factor")


def without(flags: list[str], names: tuple[str, ...]) -> list[str]:
    """The command line less the named flags and their values (each of them takes one)."""
    kept, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag in names:
            skip = True
        else:
            kept.append(flag)
    return kept


def flag_values(flags: list[str]) -> dict[str, str]:
    """Each `--flag` of a command line with the word after it ("" at the end)."""
    return {flag: value for flag, value in zip(flags, [*flags[1:], ""], strict=True) if flag.startswith("--")}


def precheck(flags: list[str]) -> str:
    """The model's family; what the references cannot run is refused before the first run: a model without a
    reference (BERT), a strategy other than FSDP2's for a Llama model, a sharded vision model (vision trains
    data-parallel)."""
    given = flag_values(flags)
    model = given.get("--model", "llama2-tiny")
    family = get_model(model).family
    spec = family_of(family)
    sharding = given.get("--sharding")
    if spec.bench_reference is None:
        with_one = " and ".join(f.kind for f in FAMILIES.values() if f.bench_reference)
        raise SpecError(f"{model}: `invoke bench train` has references for {with_one} models, none yet for {spec.kind}")
    if not spec.fsdp2:
        if sharding not in (None, *spec.shardings):
            raise SpecError(
                f"--sharding {sharding}: {model} trains data-parallel ({', '.join(spec.shardings)}) and the "
                "reference is DDP"
            )
        if "--synthetic" in given and spec.bench_input_pipeline:
            raise SpecError("--synthetic: the bench runs both inputs itself (the input pipeline and on-device)")
        return family
    if sharding and sharding not in ("FULL_SHARD", "SHARD_GRAD_OP"):
        raise SpecError(f"--sharding {sharding}: the bare reference shards with FSDP2 (FULL_SHARD or SHARD_GRAD_OP)")
    return family


def bench(flags: list[str], repeats: int, output: str | None, workdir: str | None = None) -> tuple[Path, list[str]]:
    """Run the pairs, write the results file; returns (its path, lines to print)."""
    import tempfile

    if repeats < 1:
        raise SpecError(f"--repeats {repeats}: at least 1")
    family = precheck(flags)
    unit, pipeline = family_of(family).throughput.unit, family_of(family).bench_input_pipeline
    total_steps = int(flag_values(flags).get("--steps", 60))
    env = environment()
    runs = Path(workdir or tempfile.mkdtemp(prefix="trainkit-bench-"))
    runs.mkdir(parents=True, exist_ok=True)
    peaks = {"datasheet": peak_tflops_for_device(env["device"]["name"]), "measured": measured_peak()}
    ours, theirs, ceiling, lines = [], [], [], []
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())  # a reused --workdir keeps its earlier runs

    def trainkit_run(extra: list[str], run_id: str, leave_out: tuple[str, ...] = ()) -> tuple[dict, dict, dict]:
        command = [*without(flags, leave_out), *extra, "--log-interval", "1"]
        run, steps, memory = run_trainkit(command, runs, run_id, profile_window(total_steps))
        spec = json.loads((run / SPEC_FILE).read_text())
        config = model_config(run, spec)
        profile = json.loads((run / "summary.json").read_text()).get("profile")
        world, flops = job_shape(spec, config)
        for weights in ("checkpoints", "model"):  # a bench needs the metrics and logs, not GBs of weights
            shutil.rmtree(run / weights, ignore_errors=True)
        return summarise(steps, world, flops, peaks, memory, family, profile), spec, config

    for repeat in range(repeats):
        summary, spec, config = trainkit_run([], f"bench-{stamp}-{repeat}")
        ours.append(summary)
        world, flops = job_shape(spec, config)
        run = runs / f"bench-{stamp}-{repeat}"
        out = runs / f"reference-{stamp}-{repeat}.json"
        reference = run_reference(run, spec["parallelism"]["nproc"], out, family)
        theirs.append(summarise(reference["steps"], world, flops, peaks, reference["peak_memory_bytes"], family))
        key = f"{unit}_per_s_wall"
        line = (
            f"pair {repeat + 1}: trainkit {ours[-1][key]:,.0f} {unit}/s, reference {theirs[-1][key]:,.0f} {unit}/s "
            f"(steady window, wall clock), ratio {ours[-1][key] / theirs[-1][key]:.3f}"
        )
        if pipeline:
            ceiling.append(trainkit_run(["--synthetic"], f"bench-{stamp}-{repeat}-synthetic", NOT_ON_DEVICE)[0])
            share = ours[-1][f"{unit}_per_s"] / ceiling[-1][f"{unit}_per_s"]
            line += f"; input pipeline {share:.0%} of on-device input ({ceiling[-1][f'{unit}_per_s']:,.0f} {unit}/s)"
        lines.append(line)
    record = make_record(
        flags, env, peaks, spec, config, reference["precision"], ours, theirs, ceiling if pipeline else None
    )
    ratio = record["ratio" if pipeline else "ratio_wall"]
    model = get_model(spec["model"]["name"]).label  # a model folder's or hub id's last part: no slashes
    path = Path(output or f"benchmarks/{model}-{device_slug(env)}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    spread = f"{ratio['min']:.3f}-{ratio['max']:.3f}" if len(ratio["pairs"]) > 1 else "one pair"
    basis = "median step" if pipeline else "wall clock"
    lines.append(
        f"trainkit / reference ({basis}): {ratio['median']:.3f} (median of {len(ratio['pairs'])}; {spread}) on "
        f"{env['device']['name']} x {record['job']['processes']} processes"
    )
    if pipeline:
        share = record["input_pipeline"]["median"]
        lines.append(
            f"input pipeline: {unit}/s = {share:.0%} of on-device input (median; the pipeline costs {1 - share:.0%})"
        )
    lines.append(f"results: {path} (runs and logs in {runs})")
    return path, lines
