"""What the AWS backends (SageMaker, Batch) share: boto3 clients, one per service and region, made on first use so
that a dry run, which contacts nothing, never imports boto3 (the tests hand in their own); the backend that holds
them; how job names carry a run; and this machine's record of what it submitted."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainkit.backends.base import Backend
from trainkit.infra import outputs
from trainkit.paths import make_folder, state_dir


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
    """A backend that works through boto3: its clients in the infra stack's region, made when first needed."""

    def __init__(self, clients: Clients | None = None):
        self._clients = clients

    def clients(self) -> Clients:
        if self._clients is None:
            self._clients = Clients(outputs.load_outputs().region)
        return self._clients


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
