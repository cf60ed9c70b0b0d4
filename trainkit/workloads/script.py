"""A user's own script as a workload (`invoke run --script FILE -- ARGS`), on any backend.

The script's folder is its code: it travels into the run folder, `runs/<run-id>/code/<hash>/`, named by the hash
of its content, so a pod of any node (or a restart) starts the code the user submitted and an edit makes a new
folder instead of changing files under a running job. Locally the preparation copies it from this machine; a
backend whose nodes cannot read this machine's files carries it to them first (eks: a ConfigMap, eks/render.py)
and points `Workload.code` there. The folder may hold at most CODE_LIMIT_BYTES (hidden entries and __pycache__
are left out): a ConfigMap's limit, applied on every target so that a script that runs here runs on the cluster.
Bigger code belongs in an image (`--image`).

Extra Python packages (`--requirements FILE`, pip's requirements format) are installed by every node before
torchrun starts, into a folder of their own outside the run folder (pip --target; the processes find it on
PYTHONPATH), from pip's configured index or only from a folder of wheels (`--wheelhouse DIR`: pip --no-index
--find-links; on EKS a folder on FSx), hash-checked when the file pins hashes: workloads/packages.py, which also
says what the file may not hold (option lines, credentials). What a script gets from trainkit (its run folder, its
checkpoint folder, one call to report a step): training/script.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from training.common.files import publish_bytes
from training.script import RUNNER_ENV
from training.spec import CHECKPOINT_DIR_ENV, SCRIPT_LABEL_ENV, Job
from trainkit.errors import SpecError
from trainkit.run.code import code_digest, read_code
from trainkit.run.prepare import prepare_folder
from trainkit.run.workload import Workload
from trainkit.workloads.packages import install, read_requirements

CODE_DIR = "code"


def script_workload(
    job: Job,
    script: str,
    args: list[str],
    requirements: str | None = None,
    wheelhouse: str | None = None,
    require_hashes: bool = False,
) -> Workload:
    """The workload of a user's script for this job; checks what can be checked before anything is created."""
    path = Path(script).expanduser()
    if not path.is_file() or path.suffix != ".py":
        raise SpecError(f"--script {script}: not a Python file; give the path of the .py file torchrun should start")
    folder = path.parent.resolve()
    digest = code_digest(read_code(folder, job.run.runs_dir))
    lines = read_requirements(requirements, require_hashes)
    if wheelhouse is not None and not lines:
        raise SpecError("--wheelhouse is where --requirements are installed from; give --requirements too")
    return Workload(
        label=path.name,
        script=str(job.run_dir / CODE_DIR / digest / path.name),
        args=tuple(args),
        env={CHECKPOINT_DIR_ENV: str(job.run_dir / "checkpoints"), SCRIPT_LABEL_ENV: path.stem, **RUNNER_ENV},
        prepare="trainkit.workloads.script:prepare",
        code=str(folder),
        requirements=lines,
        wheelhouse=wheelhouse,
    )


def prepare(job: Job, workload: Workload) -> dict[str, str]:
    """On the node: the run folder and spec.json, the code in its folder (files published atomically, so pods may
    race), the packages installed; returns the processes' extra environment (PYTHONPATH to the packages)."""
    prepare_folder(job)
    source, target = Path(str(workload.code)), Path(str(workload.script)).parent
    if not source.is_dir():
        raise SpecError(f"the script's code is not at {source} on this node")
    files = read_code(source, job.run.runs_dir)
    if code_digest(files) != target.name:
        raise SpecError(f"the script's folder {source} changed since it was submitted; submit it again")
    for name, data in files.items():
        publish_bytes(target / name, data)
    if not workload.requirements:
        return {}
    packages = install(workload.requirements, workload.wheelhouse)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(packages), os.environ.get("PYTHONPATH")]))}


def run_id_for(script: str | None, args: list[str]) -> str:
    """The script's name and a hash of the command (its path and arguments): the same command gets the same run, so
    running it again resumes from the run's checkpoints, also on another number of nodes or processes (what a run
    trains does not depend on where it runs; a script's own checkpoints must load at another world size for that)."""
    if not script:
        raise SpecError("--script FILE is required: the Python file torchrun should start on every node")
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(script).stem).strip("-.") or "script"
    shape = [str(Path(script).expanduser().resolve()), *args]
    return f"{stem[:40]}-{hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:8]}"
