"""The interface every backend implements (see README.md in this folder for what each method owes), and what it
runs: a `Workload`."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from training.spec import Job
from trainkit import hardware
from trainkit.errors import SpecError
from trainkit.job.build import Machine
from trainkit.run.secrets import Credential
from trainkit.run.state import RunStatus
from trainkit.run.workload import Workload


@dataclass(frozen=True)
class RunRef:
    """Which run `status`, `logs` and `stop` act on: a run id (None: the newest the backend knows) and
    where to look (local: the runs folder; EKS: the namespace)."""

    run_id: str | None = None
    runs_dir: str = "runs"
    namespace: str | None = None


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
    def status(self, ref: RunRef) -> RunStatus:
        """A run's state (trainkit/run/state.py, the same values on every target) and the target's account of it,
        its processes or pods, as text."""

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

    def export_location(self, run_id: str | None) -> str:
        """Where a finished decoder run's export is on this target, and how to copy the run (without its checkpoints)
        into the local runs folder, where `invoke generate` loads it."""
        return f"--target {self.name} keeps its runs here: give --runs-dir"

    def put_secret(self, credential: Credential, token: str, ref: RunRef) -> str:
        """Keep a credential where this target's jobs read it (`invoke secrets.<name>`); says where."""
        raise SpecError(
            f"--target {self.name} keeps no {credential.what}: its runs read {credential.env} from your environment"
            + (" or the Hugging Face CLI's file" if credential.env == "HF_TOKEN" else "")
        )
