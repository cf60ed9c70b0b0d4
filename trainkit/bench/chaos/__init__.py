"""Fault injection for elastic jobs on this machine: kill workers, nodes, agents or the rendezvous store
mid-run, and measure what the job does about it.

Each scenario starts a real elastic job (`--nodes 1:2 --nproc 1`: two torchrun agents, each a
"node", at a real c10d or etcd rendezvous), waits until training has passed `fault_step`, injects
its fault (into the last node, unless the scenario names node 0, which hosts the c10d store; see
trainkit/backends/local/backend.py) and watches the job to its end under a hard timeout. It reads what the
run leaves, `metrics.jsonl` (every step with a wall-clock time) and `events.jsonl` (starts,
resumes, checkpoints, stops), and records:

    outcome       finished | error | timeout
    restarts      resumes from a checkpoint after the fault
    recovery_s    last step logged before the fault -> first step logged after it
    steps_lost    steps done before the fault that had to be redone (<= checkpoint interval)
    final_step    and final_loss, against an uninterrupted run of the same job (loss_delta)

`invoke chaos` runs scenarios from the command line; `invoke bench elastic` runs all of them on
both backends and writes benchmarks/elastic.json plus the docs' table (docs/generated/elastic-table.md);
tests/e2e/test_chaos.py runs them all in `make test`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from trainkit.bench.chaos.harness import run_baseline, run_matrix, run_scenario
from trainkit.bench.chaos.scenarios import BACKENDS, SCENARIOS, Result, Scenario, Settings, select
from trainkit.bench.chaos.table import TABLE_FILE, describe, render_table, table_file

__all__ = [
    "BACKENDS",
    "SCENARIOS",
    "Result",
    "Scenario",
    "Settings",
    "bench",
    "describe",
    "TABLE_FILE",
    "render_table",
    "run",
    "run_baseline",
    "run_matrix",
    "run_scenario",
    "select",
    "table_file",
]


def run(scenarios: str, backends: str, workdir: str | None, parallel: int) -> tuple[dict, bool]:
    """`invoke chaos`: the selected scenarios on local elastic jobs; (benchmark record, all as expected)."""
    pairs = select(scenarios, backends)
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="trainkit-chaos-"))
    print(f"{len(pairs)} scenario(s); runs under {root}", flush=True)
    record = run_matrix(pairs, root, parallel=parallel, report=lambda line: print(line, flush=True))
    ok = all(result["ok"] for result in record["results"])
    if workdir is None:
        # A temporary folder of a matrix that went as expected holds nothing to read (~1.7 GB of
        # checkpoints and etcd data); one with a surprise is kept for its logs.
        if ok:
            shutil.rmtree(root, ignore_errors=True)
            print(f"all as expected: removed {root}", flush=True)
        else:
            print(f"runs kept for their logs: {root}", flush=True)
    return record, ok


def bench(output: str, table: str | None, scenarios: str, backends: str, parallel: int) -> bool:
    """`invoke bench elastic`: `run` over the matrix, written to `output` (JSON) and the docs' generated table file
    `table` (None: not written); True when all went as expected."""
    record, ok = run(scenarios, backends, None, parallel)
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
    if table:
        Path(table).write_text(table_file(record))
        print(f"wrote the elastic table {table}")
    return ok
