"""The interface every backend implements (see README.md in this folder for what each method owes)."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass

from training.common.job import Job
from trainkit.job.build import Machine


@dataclass(frozen=True)
class RunRef:
    """Which run `status`, `logs` and `stop` act on: a run id (None: the newest the backend knows) and
    where to look (local: the runs folder; EKS: the namespace)."""

    run_id: str | None = None
    runs_dir: str = "runs"
    namespace: str | None = None


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

    @abc.abstractmethod
    def submit(self, job: Job, dry_run: bool = False) -> int:
        """Run a validated job, or with `dry_run` print what would run and create nothing. Returns 0 once the job
        finished (backends that hand the job to a scheduler: once it is accepted); a job that ran and failed
        raises JobFailed with its exit code and its cause in one line."""

    @abc.abstractmethod
    def status(self, ref: RunRef) -> str:
        """A run's state and its processes or pods, as text."""

    @abc.abstractmethod
    def logs(self, ref: RunRef, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        """Lines of the leader's log, or of one global rank."""

    @abc.abstractmethod
    def stop(self, ref: RunRef) -> str:
        """Stop a run (its outputs stay; the same command resumes it); says what was done."""
