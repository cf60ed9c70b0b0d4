"""What the Invoke tasks do, as plain functions (tasks.py stays a thin layer of flags and help)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from .backends import get_backend
from .launch import prepare_run
from .plan import PlanInputs, make_plan, render_plan
from .spec import build_spec, load_profile, machine_process_limit


def train(overrides: dict[str, Any], profile: str = "local") -> int:
    """Validate, prepare the run directory, run the job; returns the job's exit code."""
    spec = build_spec(overrides, profile=profile)
    run = prepare_run(spec)
    label = f" [{spec.truncated_label}]" if spec.truncated_label else ""
    for note in spec.notes:
        print(f"note: {note}", flush=True)
    print(
        f"run {spec.run_id}{label}: {spec.model}, {spec.nodes} node(s) x {spec.nproc} process(es), "
        f"{spec.sharding}, {spec.steps or f'{spec.epochs} epoch(s)'} steps -> {spec.run_dir}",
        flush=True,
    )
    return get_backend(spec.target).submit(run)


def plan(inputs: PlanInputs, as_json: bool = False) -> str:
    result = make_plan(inputs)
    if as_json:
        data = asdict(result)
        for name, breakdown in result.memory_per_gpu.items():
            data["memory_per_gpu"][name]["total"] = breakdown.total
        return json.dumps(data, indent=2)
    return render_plan(result)


def up(profile: str) -> str:
    """Local profile: there is no infrastructure to create; report what this machine offers."""
    import importlib.util

    load_profile(profile)
    limit, what = machine_process_limit()
    torch_ok = importlib.util.find_spec("torch") is not None
    return "\n".join(
        [
            f"{profile} profile: jobs run as processes on this machine; c10d rendezvous needs no server.",
            f"  capacity      {what} -> up to {limit} training process(es)",
            f"  torch         {'installed' if torch_ok else 'MISSING: run make setup'}",
        ]
    )


def down(profile: str) -> str:
    load_profile(profile)
    return f"{profile} profile: no services to stop; run outputs under runs/ are kept."
