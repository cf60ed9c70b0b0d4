"""Fault injection and benchmarks (top level): `chaos`, `bench <what>`."""

from __future__ import annotations

from invoke import Exit, task

from .options import user_errors

CHAOS_HELP = {
    "scenario": "Comma list of scenarios, or all (see README, Elastic training): worker-kill, node-kill, ...",
    "rdzv": "Comma list of rendezvous backends or all: c10d, etcd (etcd: a local etcd is started per scenario).",
    "parallel": "Scenarios run at once (1 gives undisturbed timings).",
}
BENCHMARKS = ("elastic",)


@task(help={**CHAOS_HELP, "workdir": "Where the runs go (default: a new temporary directory)."})
@user_errors
def chaos(c, scenario="all", rdzv="all", workdir=None, parallel=1):
    """Kill workers, nodes, agents or the rendezvous store of local elastic jobs and report what happened."""
    from .. import chaos as harness

    _record, ok = harness.run(scenario, rdzv, workdir, int(parallel))
    if not ok:
        raise Exit("some scenarios did not end as expected (see above)", code=1)


@task(
    positional=["what"],
    help={
        "what": f"Which benchmark: {', '.join(BENCHMARKS)}.",
        **CHAOS_HELP,
        "output": "JSON results file (default: benchmarks/<what>.json).",
        "readme": "README whose table is rewritten from the results ('' to leave it).",
    },
)
@user_errors
def bench(c, what, output=None, readme="README.md", scenario="all", rdzv="all", parallel=1):
    """Run a benchmark and write its results file. elastic: recovery from every fault on both backends."""
    from .. import chaos as harness

    if what not in BENCHMARKS:
        raise Exit(f"error: unknown benchmark {what!r}; choose one of: {', '.join(BENCHMARKS)}", code=2)
    output = output or f"benchmarks/{what}.json"
    if not harness.bench(output, readme or None, scenario, rdzv, int(parallel)):
        raise Exit("some scenarios did not end as expected (see above)", code=1)


TASKS = (chaos, bench)
