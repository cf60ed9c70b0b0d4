"""The interface every backend implements (see README.md in this folder for what each method owes), and what it
runs: a `Workload`."""

from __future__ import annotations

import abc
import importlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from training.common.files import publish_text
from training.spec import RUN_DIR_ENV, Job
from trainkit import hardware
from trainkit.errors import SpecError
from trainkit.job.build import Machine
from trainkit.run.torchrun import PreparedRun


@dataclass(frozen=True)
class RunRef:
    """Which run `status`, `logs` and `stop` act on: a run id (None: the newest the backend knows) and
    where to look (local: the runs folder; EKS: the namespace)."""

    run_id: str | None = None
    runs_dir: str = "runs"
    namespace: str | None = None


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


def cloud_machine(job: Job, default_image: str, prefix: str = "") -> Machine:
    """A cloud target's node: its instance type from the instance table (named with the target's `prefix`, as
    SageMaker's `ml.`), one process per GPU unless --nproc says otherwise, and the image unless --image gives one."""
    placement, known = job.placement, hardware.INSTANCE_TYPES
    if placement.instance_type not in known:
        raise SpecError(
            f"--instance-type {prefix + placement.instance_type!r} is not in the instance table; choose one of: "
            f"{', '.join(prefix + name for name in known)}"
        )
    instance = known[placement.instance_type]
    if job.parallelism.nproc is None:
        job.parallelism.nproc = instance.gpus
    if placement.image is None:
        placement.image = default_image
    return Machine(instance.gpus, cpus_per_node=instance.vcpus)


def deadline_cause_line(limit: int | None, held_by: str, done: str, run_id: str) -> str:
    """The one line `invoke status` gives a job its target stopped at its --max-runtime deadline, the same on every
    target: the limit and what held it (`held_by`), what the target did then (`done`), how to resume."""
    return (
        f"stopped at its --max-runtime deadline ({limit} s {held_by}): {done}; submit again with --run-id {run_id} "
        "to resume with a fresh window"
    )


class Backend(abc.ABC):
    name = ""

    @abc.abstractmethod
    def resolve(self, job: Job) -> Machine:
        """Fill in what depends on where the job runs (processes per node, rendezvous, image ...) for the
        fields the user left open, and say what the machine offers. Probes; never creates anything."""

    def check(self, job: Job) -> None:
        """Rules only this target has, after the target-free ones (trainkit/job/validate.py); pure. Raises
        SpecError naming the flag to change. None by default."""
        return None

    def storage_mb_s(self, job: Job) -> float | None:
        """The write throughput (MB/s) of the storage the job's run folder is on, when --storage-mb-s leaves it open:
        what the stall watchdog allows a checkpoint and the export for (trainkit/run/storage.py plan_slow_phases);
        None: unknown (they get the watchdog's least allowance)."""
        return None

    def storage_hosts(self, job: Job) -> int:
        """How many hosts write a checkpoint's parts at once, each to a volume of its own at storage_mb_s; 1 (the
        default): the run folder is one shared storage, whose throughput is the whole."""
        return 1

    def path_for(self, job: Job, path: str, flag: str) -> str:
        """A path of the user's as the job's processes see it (eks: relative to the FSx mount, their working
        directory; a path off the volume is refused naming `flag`). As given by default."""
        return path

    @abc.abstractmethod
    def submit(self, job: Job, workload: Workload, dry_run: bool = False) -> int:
        """Run a workload as a validated job, or with `dry_run` print what would run and create nothing. Returns 0
        once the job finished (backends that hand the job to a scheduler: once it is accepted); a job that ran and
        failed raises JobFailed with its exit code and its cause in one line."""

    @abc.abstractmethod
    def status(self, ref: RunRef) -> str:
        """A run's state and its processes or pods, as text."""

    @abc.abstractmethod
    def logs(self, ref: RunRef, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        """Lines of the leader's log, or of one global rank."""

    @abc.abstractmethod
    def stop(self, ref: RunRef) -> str:
        """Stop a run (its outputs stay; the same command resumes it); says what was done."""

    def fetch_run_files(self, run_id: str, into: Path) -> bool:
        """Copy a run's small files (spec, metrics, summary, events) from where this target keeps them into
        `into`, for `invoke obs.report`; False: this target keeps none apart from the local runs folder."""
        return False

    def put_hf_token(self, token: str, ref: RunRef) -> str:
        """Keep the Hugging Face token where this target's jobs read it (`invoke secrets.hf-token`); says where."""
        raise SpecError(f"--target {self.name} keeps no token: its runs read HF_TOKEN or the Hugging Face CLI's file")
