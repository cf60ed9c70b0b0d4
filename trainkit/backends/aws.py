"""What the AWS backends (SageMaker, Batch) share: boto3 clients, one per service and region, made on first use so
that a dry run, which contacts nothing, never imports boto3 (the tests hand in their own); the backend that holds
them and takes the steps both services take; how job names carry a run; and this machine's record of what it
submitted."""

from __future__ import annotations

import abc
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.spec import Job
from trainkit.backends.base import Backend, RunRef
from trainkit.errors import SpecError
from trainkit.infra import outputs
from trainkit.paths import make_folder, state_dir
from trainkit.run.secrets import Credential
from trainkit.run.state import RunStatus
from trainkit.run.workload import Workload


@dataclass
class Clients:
    """boto3 clients for one region, made on first use (tests hand in their own)."""

    region: str | None = None
    made: dict = field(default_factory=dict)

    def region_name(self) -> str | None:
        """The region these clients call: the stack's, else what boto3 finds (environment, config file)."""
        import boto3

        return self.region or boto3.session.Session().region_name

    def __call__(self, service: str):
        if service not in self.made:
            import boto3

            self.made[service] = boto3.client(service, region_name=self.region)
        return self.made[service]


class AwsBackend(Backend):
    """A backend that hands its jobs to an AWS service through boto3 (its clients in the infra stack's region, made
    when first needed). The steps both services take are here once, as SkyPilot's `Backend` wraps `_provision` and
    `_execute` in its public methods: `submit` (notes, the refusal of a data task, the dry run or the submission,
    the line saying where to look), `status`, `logs` and `stop` of a run's newest job. A service supplies the `_`
    methods."""

    label = ""
    """The service as messages name it (`SageMaker`, `Batch`)."""

    def __init__(self, clients: Clients | None = None):
        self._clients = clients

    def clients(self) -> Clients:
        if self._clients is None:
            self._clients = Clients(outputs.load_outputs().region)
        return self._clients

    # ------------------------------------------------------------------ what a service supplies

    @abc.abstractmethod
    def _stack(self) -> Any:
        """The service's stack as `make up` recorded it (placeholders where it did not)."""

    def _notes(self, job: Job, workload: Workload) -> list[str]:
        """What to say before anything else (stderr: a dry run's stdout is only its requests)."""
        return list(job.run.notes)

    def _check_workload(self, job: Job, workload: Workload, stack: Any) -> None:  # noqa: B027 - optional
        """What the service refuses of a workload, before anything is shown or sent (raises SpecError)."""

    def _dry_run_notes(self, job: Job, workload: Workload, stack: Any) -> list[str]:
        return []

    @abc.abstractmethod
    def _dry_run(self, job: Job, workload: Workload, stack: Any) -> str:
        """The requests a submission would send, as printed; contacts nothing."""

    @abc.abstractmethod
    def _submit(self, job: Job, workload: Workload, stack: Any, clients: Clients) -> tuple[str, tuple[str, ...]]:
        """Preflight and submit; (the job's name, what else identifies it, such as its id)."""

    @abc.abstractmethod
    def _newest(self, clients: Clients, run_id: str | None) -> tuple[str, str]:
        """(run id, the service's handle of its newest job) of a run, or of the newest run without one."""

    @abc.abstractmethod
    def _status(self, clients: Clients, run_id: str, job: str) -> RunStatus: ...

    @abc.abstractmethod
    def _logs(self, clients: Clients, run_id: str, job: str, rank: int | None, follow: bool) -> Iterator[str]: ...

    @abc.abstractmethod
    def _stop(self, clients: Clients, job: str) -> str: ...

    # ------------------------------------------------------------------ the steps, once

    def submit(self, job: Job, workload: Workload, dry_run: bool = False) -> int:
        for note in self._notes(job, workload):
            print(f"note: {note}", file=sys.stderr, flush=True)
        if not workload.distributed:
            raise SpecError(f"--target {self.name} runs training jobs; run data tasks with --target local or eks")
        stack = self._stack()
        self._check_workload(job, workload, stack)
        if dry_run:
            for note in self._dry_run_notes(job, workload, stack):
                print(f"note: {note}", file=sys.stderr, flush=True)
            print(self._dry_run(job, workload, stack), flush=True)
            return 0
        name, details = self._submit(job, workload, stack, self.clients())
        run_id = job.run.run_id
        print(
            f"submitted {self.label} job {name} ({', '.join([*details, f'run {run_id}'])}): `invoke status --run-id "
            f"{run_id}`, `invoke logs --run-id {run_id} -f`, `invoke stop --run-id {run_id}`",
            flush=True,
        )
        return 0

    def status(self, ref: RunRef) -> RunStatus:
        clients = self.clients()
        return self._status(clients, *self._newest(clients, ref.run_id))

    def logs(self, ref: RunRef, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        clients = self.clients()
        return self._logs(clients, *self._newest(clients, ref.run_id), rank, follow)

    def stop(self, ref: RunRef) -> str:
        clients = self.clients()
        return self._stop(clients, self._newest(clients, ref.run_id)[1])

    def put_secret(self, credential: Credential, token: str, ref: RunRef) -> str:
        """The credential as its stack secret's new value (PutSecretValue: the value travels in the request body
        only, never in Terraform's state, which made the secret empty)."""
        stack = self._stack()
        arn = stack.secret_arn(credential) if stack.recorded else None
        if not arn:
            raise SpecError(
                f"no {self.label} stack recorded with a secret for the {credential.what}: `make up PROFILE=aws` with "
                f"{self.name}_enabled = true creates it"
            )
        self.clients()("secretsmanager").put_secret_value(SecretId=arn, SecretString=token)
        return f"stored the {credential.what} in {arn} ({self.label} {credential.readers})"


def secret_state(clients: Clients, arn: str | None) -> str:
    """ "value", "empty" (the secret exists without a value: Terraform made it, `invoke secrets.*` did not fill it
    yet) or "missing" (no ARN, or no secret of it)."""
    from botocore.exceptions import ClientError

    if not arn:
        return "missing"
    try:
        described = clients("secretsmanager").describe_secret(SecretId=arn)
    except ClientError:
        return "missing"
    stages = [stage for stages in described.get("VersionIdsToStages", {}).values() for stage in stages]
    return "value" if "AWSCURRENT" in stages else "empty"


def s3_parts(uri: str) -> tuple[str, str]:
    """(bucket, key) of an s3:// URI; the key as written (a prefix keeps its trailing slash)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def error_code(error: Exception) -> str | None:
    """The AWS error code of a botocore ClientError (None for anything else)."""
    return getattr(error, "response", {}).get("Error", {}).get("Code")


def stamp() -> str:
    """A submission's UTC stamp (job names end with it: every submission of a run gets a name of its own)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def of_run(name: str, prefix: str) -> bool:
    """A job name is the run's prefix, a dash and a stamp: not another run's that shares the prefix."""
    rest = name[len(prefix) :] if name.startswith(prefix) else None
    return rest is not None and rest[:1] == "-" and rest[1:].replace("-", "").isdigit()


@dataclass(frozen=True)
class Submissions:
    """What this machine submitted to a managed target, one file per run (`<state>/<target>/<run id>.json`, a list
    of jobs, newest last): how `invoke status / logs / stop --run-id` find a run without `--target`."""

    target: str

    def folder(self) -> Path:
        return state_dir() / self.target

    def file(self, run_id: str) -> Path:
        return self.folder() / f"{run_id}.json"

    def remember(self, run_id: str, **entry) -> None:
        path = self.file(run_id)
        make_folder(path.parent)
        known = json.loads(path.read_text()) if path.is_file() else {"jobs": []}
        known["jobs"].append({**entry, "submitted": time.strftime("%Y-%m-%dT%H:%M:%SZ")})
        path.write_text(json.dumps(known, indent=2) + "\n")

    def newest(self, run_id: str) -> dict | None:
        """The run's last submission from here (None: none)."""
        path = self.file(run_id)
        return json.loads(path.read_text())["jobs"][-1] if path.is_file() else None

    def last_run(self) -> str | None:
        """The run submitted last from here (None: none)."""
        files = sorted(self.folder().glob("*.json"), key=lambda p: p.stat().st_mtime)
        return files[-1].stem if files else None

    def submitted_at(self, run_id: str | None) -> float | None:
        """When the run (without a run id: any run) was last submitted from here, as a file time (None: never)."""
        paths = [self.file(run_id)] if run_id else list(self.folder().glob("*.json"))
        times = [path.stat().st_mtime for path in paths if path.is_file()]
        return max(times) if times else None
