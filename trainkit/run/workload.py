"""What a backend runs on every node of a job (`Workload`), and how a node makes the run folder ready for it
(`ready`): the run package's, so that no module of trainkit/run/ reaches up into trainkit/backends/."""

from __future__ import annotations

import importlib
import json
from dataclasses import asdict, dataclass, field

from training.common.files import publish_text
from training.spec import RUN_DIR_ENV, Job
from trainkit.run.torchrun import PreparedRun

WORKLOAD_FILE = "workload.json"
SCRIPT_RUNNER = "training.script"
"""`python -m training.script FILE ARGS`: how every rank starts a user's script."""
WORKLOAD_ENV = "TRAINKIT_WORKLOAD"


@dataclass(frozen=True)
class Workload:
    """What a backend starts on every node of a job: torchrun (trainkit.run.agent) over a Python module or a
    script, with its arguments. The job says where and on how many processes; the workload says what runs there,
    how a node makes the run folder ready for it (`prepare`, run where the folder lives: here, or in each pod), and
    whether the target retries a failure. It travels as JSON: the run folder's workload.json, and on a cluster the
    pods' TRAINKIT_WORKLOAD."""

    label: str
    """What it runs, in a few words (the model's name, the script's file name); the EKS model label."""
    module: str | None = None
    """`python -m MODULE` ..."""
    script: str | None = None
    """... or a file, as torchrun's working directory sees it (a user's code travels into the run folder)."""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    """Plain settings for every process; never a secret (those come from prepare, or the target's own store)."""
    prepare: str = "trainkit.run.prepare:prepare_run"
    """"module:function" taking (job, workload), run before torchrun where the run folder lives; returns the
    secrets the processes need as environment variables. Imported by name, so a backend needs no workload module."""
    token: bool = True
    """Whether its processes may read the Hugging Face token the target keeps (the sweep needs none)."""
    restarts: bool = True
    """False: the first failure fails the job (no torchrun restarts, no replacement pods): a fabric test must."""
    outputs: tuple[str, ...] = ()
    """Files in the run folder worth naming when the run ends (the sweep's report)."""
    distributed: bool = True
    """False: a task, one process (`python -m module args`) on one node, no torchrun and no run folder (the data
    copy); the target runs it where its data lives (eks: a batch/v1 Job on a CPU node)."""
    reads: dict[str, str] = field(default_factory=dict)
    """s3:// URLs it reads, by the flag that gave them: a target checks its nodes may read them (eks: the data
    service account's buckets, data_source_buckets) before anything is created."""
    writes: str | None = None
    """A folder it writes outside any run folder, as `Backend.path_for` gave it: one writer at a time."""
    follow: bool = False
    """A target that hands the workload to a scheduler waits for its end and streams its log (local: always)."""
    code: str | None = None
    """A user's code: the folder prepare copies into the run folder (script workloads), as the preparing node sees
    it; a backend whose nodes cannot see this machine's files carries it there (eks: a ConfigMap)."""
    requirements: tuple[str, ...] = ()
    """pip requirement lines installed for the run before torchrun starts (script workloads)."""
    wheelhouse: str | None = None
    """Where those come from without an index: a folder of wheels (pip --no-index --find-links)."""

    def entry(self) -> list[str]:
        """What follows torchrun's own options. A script starts through training.script's runner, which records
        what ends it on the failure channel as a recipe's ranks do (training/common/failure.py)."""
        if self.module:
            return ["-m", self.module, *self.args]
        return ["-m", SCRIPT_RUNNER, str(self.script), *self.args]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Workload:
        data = json.loads(text)
        return cls(
            **{
                **data,
                "args": tuple(data["args"]),
                "outputs": tuple(data["outputs"]),
                "requirements": tuple(data["requirements"]),
            }
        )


def prepared_env(job: Job, workload: Workload) -> dict[str, str]:
    """Run the workload's preparation ("module:function", imported by name): the environment it adds."""
    module, _, name = workload.prepare.partition(":")
    return getattr(importlib.import_module(module), name)(job, workload)


def ready(job: Job, workload: Workload) -> PreparedRun:
    """Run the workload's preparation where the run folder lives (see Workload.prepare) and say how each node
    starts it; a preparation that refuses raises SpecError before any process starts."""
    secrets = prepared_env(job, workload)
    publish_text(job.run_dir / WORKLOAD_FILE, workload.to_json() + "\n")
    env = {**workload.env, RUN_DIR_ENV: str(job.run_dir), **secrets}
    return PreparedRun(job, workload.entry(), env, workload.restarts)
