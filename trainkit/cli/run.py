"""`invoke run` (top level): a user's own torchrun-ready script on any target, with what a recipe gets."""

from __future__ import annotations

import shlex
import sys

from trainkit.cli.options import job_flags, job_options, task, user_errors

# What a script's job is made of: where and on how many processes it runs, and how it reports; the model, data
# and optimisation fields describe a recipe and are not options here.
RUN_KEYS = [
    "target",
    "nodes",
    "nproc",
    "max_restarts",
    "rdzv",
    "rdzv_endpoint",
    "collective_timeout",
    "run_id",
    "runs_dir",
    "metrics_port",
    "instance_type",
    "image",
    "namespace",
    "hf_token_file",
    "track",
    "tracking_uri",
    "experiment",
]


def script_arguments(remainder: str) -> list[str]:
    """What follows `--`, as the shell split it (Invoke joins it into one string, which loses the quoting)."""
    if "--" in sys.argv:
        return sys.argv[sys.argv.index("--") + 1 :]
    return shlex.split(remainder)


def _run(c, script, requirements=None, wheelhouse=None, require_hashes=False, profile="local", dry_run=False, **values):
    """Run your own script under torchrun on every node (`-- ARGS` go to it): a run folder and id, rendezvous,
    elastic restarts, per-rank logs, status/logs/stop, metrics; its folder travels with the job."""
    from trainkit.backends import resolve_job
    from trainkit.workloads.script import run_id_for, script_workload

    flags = {**job_flags(values, RUN_KEYS), "workload": "script"}
    args = script_arguments(c.remainder)
    flags["run_id"] = flags["run_id"] or run_id_for(script, args)
    job, backend, _ = resolve_job(flags, profile)
    workload = script_workload(job, script, args, requirements, wheelhouse, require_hashes)
    backend.submit(job, workload, dry_run=dry_run)


_run_body, _run_help = job_options(
    _run,
    RUN_KEYS,
    {
        "script": None,
        "requirements": None,
        "wheelhouse": None,
        "require_hashes": False,
        "profile": "local",
        "dry_run": False,
    },
)
run = task(
    help={
        **_run_help,
        "script": "The Python file torchrun starts on every node; its folder travels with the job (docs/own-script.md: "
        "what it gets and how it checkpoints).",
        "requirements": "A pip requirements file installed on every node before the script starts: package lines "
        "(with --hash=sha256:... to pin archives; then pip checks every package's hash), no pip option lines and no "
        "credentials in URLs.",
        "wheelhouse": "Install --requirements only from this folder of wheels (eks: a folder on FSx).",
        "require-hashes": "Refuse --requirements unless every line pins its archives with --hash (pip's "
        "hash-checking mode: nothing is installed without a matching hash).",
        "run-id": "Name of the run and its folder (default: the script's name and a hash of the command, so the "
        "same command resumes the same run).",
        "profile": "Profile YAML (trainkit/job/profiles): local (default) or aws.",
        "dry-run": "Print what would run and create nothing: the job and the workload (local) or the PyTorchJob and "
        "its code ConfigMap (eks).",
    },
    name="run",
)(user_errors(_run_body))

TASKS = (run,)
