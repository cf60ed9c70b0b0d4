"""The launcher's side of experiment tracking (issue 54): what --track, --tracking-uri and --experiment may say,
checked before anything is created, and the commit the MLflow run is tagged with."""

from __future__ import annotations

import os
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from training.spec import Job
from trainkit.errors import SpecError
from trainkit.run.secrets import MLFLOW_TOKEN, sends_token

# botocore's SageMaker service model: TrackingServerArn and MlflowAppArn (the two resource types the sagemaker-mlflow
# plugin signs requests for: sagemaker_mlflow/auth_provider.py _get_auth_service_name), with the name a
# CreateMlflowTrackingServer accepts (TrackingServerName).
TRACKING_SERVER_ARN = re.compile(
    r"arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]+:[0-9]{12}:(mlflow-tracking-server/[a-zA-Z0-9](-*[a-zA-Z0-9]){0,255}"
    r"|mlflow-app/[A-Za-z0-9\-]{1,100})"
)
ACCEPTED = (
    "http(s)://HOST[:PORT], a SageMaker managed MLflow tracking server's ARN "
    "(arn:aws:sagemaker:REGION:ACCOUNT:mlflow-tracking-server/NAME), or sqlite:///FILE"
)
HEALTH_TIMEOUT_S = 5.0


def validate_tracking(job: Job) -> None:
    """The tracking options alone and with the target (pure: no network)."""
    t = job.tracking
    if not t.enabled:
        for value, flag in ((t.uri, "--tracking-uri"), (t.experiment, "--experiment")):
            if value is not None:
                raise SpecError(f"{flag} {value} says where a tracked run goes; add --track mlflow, or drop {flag}")
        return
    if t.experiment is not None and not t.experiment.strip():
        raise SpecError("--experiment is empty; give the MLflow experiment's name, or drop it for 'trainkit'")
    uri = t.uri
    if uri is None:
        return
    scheme = uri.partition(":")[0].lower()
    if scheme == "arn":
        if not TRACKING_SERVER_ARN.fullmatch(uri):
            raise SpecError(
                f"--tracking-uri {uri} is not a SageMaker MLflow tracking server's ARN; give "
                "arn:aws:sagemaker:REGION:ACCOUNT:mlflow-tracking-server/NAME (`aws sagemaker "
                "list-mlflow-tracking-servers` lists them)"
            )
        return
    if scheme in ("http", "https"):
        if "@" in uri.partition("://")[2].partition("/")[0]:
            raise SpecError(
                f"--tracking-uri {redacted(uri)} carries credentials, which would be written into the spec; give the "
                "server's URL without them (a token comes from a file or a secret)"
            )
        if not uri.partition("://")[2].partition("/")[0]:
            raise SpecError(f"--tracking-uri {uri} names no host; give {ACCEPTED}")
        return
    if scheme == "sqlite":
        if job.placement.target != "local":
            raise SpecError(
                f"--tracking-uri {uri}: a SQLite file is this machine's; on --target {job.placement.target} give a "
                "tracking server (or drop --tracking-uri for the store in the runs folder)"
            )
        if not uri.startswith("sqlite:///"):
            raise SpecError(f"--tracking-uri {uri}: give a SQLite file as sqlite:///FILE")
        return
    raise SpecError(
        f"--tracking-uri {redacted(uri)}: {scheme or 'no'} scheme is not one trainkit sends to; give {ACCEPTED}"
    )


def redacted(uri: str) -> str:
    scheme, sep, rest = uri.partition("://")
    host = rest.partition("/")[0]
    return f"{scheme}{sep}***@{rest.partition('@')[2]}" if sep and "@" in host else uri


def check_reachable(job: Job, where_runs: str) -> str | None:
    """An http(s) tracking server's health at submit (MLflow's server answers GET /health). Unreachable from here:
    a refusal when the job runs here (`where_runs` is "here": it could not reach it either), else the warning to
    print (a cluster's network may reach what this machine cannot). None: it answers, or there is nothing to ask."""
    uri = job.tracking.uri
    if not sends_token(job):
        return None
    token = os.environ.get(MLFLOW_TOKEN.env, "").strip()
    asked = urllib.request.Request(
        uri.rstrip("/") + "/health", headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    try:
        with urllib.request.urlopen(asked, timeout=HEALTH_TIMEOUT_S) as answer:
            if answer.status < 400:
                return None
            problem = f"GET /health answered {answer.status}"
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):  # a server that wants a token (MLflow's client sends MLFLOW_TRACKING_TOKEN)
            return token_note(job, error.code, where_runs)
        problem = f"GET /health answered {error.code}"
    except (OSError, ValueError) as error:
        problem = str(getattr(error, "reason", error))
    if where_runs == "here":
        raise SpecError(
            f"--tracking-uri {uri}: no MLflow server answers there ({problem}); the run's processes run on this "
            "machine and could not reach it either: start the server, or correct the URL"
        )
    return (
        f"--tracking-uri {uri}: no MLflow server answers from this machine ({problem}); the job's own network may "
        "reach it; if not, its metrics wait in memory and the run goes on"
    )


def token_note(job: Job, code: int, where_runs: str) -> str:
    """A server that refused the launcher's request for want of a valid token: refused when the run's processes run
    here with this environment's token (none, or one the server refuses); for a cluster target, where its job reads
    the token it sends."""
    uri, target = job.tracking.uri, job.placement.target
    if where_runs == "here":
        raise SpecError(
            f"--tracking-uri {uri}: the server answered {code} to this environment's token ({MLFLOW_TOKEN.env}, "
            f"{'set' if os.environ.get(MLFLOW_TOKEN.env, '').strip() else 'not set'}); the run's processes would be "
            f"refused too: set {MLFLOW_TOKEN.env} to a token the server takes"
        )
    return (
        f"--tracking-uri {uri} answered {code} without a valid token: the job sends the one `invoke "
        f"secrets.{MLFLOW_TOKEN.name} --target {target}` stored (none stored: its metrics wait and the run goes on)"
    )


def tracking_notes(job: Job) -> list[str]:
    """What is worth saying at submit about where the job logs: a server that does not answer from here (refused
    when the job runs here), a port the job's security group does not let out."""
    said = (check_reachable(job, "here" if job.placement.target == "local" else "elsewhere"), egress_note(job))
    return [note for note in said if note]


def egress_note(job: Job) -> str | None:
    """An http(s) server on a port other than 443, for a target whose jobs the infra stack lets out on 443 only."""
    uri, target = job.tracking.uri or "", job.placement.target
    if target not in EGRESS_443 or not sends_token(job):
        return None
    parts = urllib.parse.urlsplit(uri)
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    if port == 443:
        return None
    return (
        f"--tracking-uri {uri}: a {target} job's security group lets it out on TCP 443 only ({EGRESS_443[target]}); "
        f"a server on port {port} is reached only where a rule lets it out"
    )


EGRESS_443 = {
    "sagemaker": "terraform/modules/sagemaker, training_https",
    "batch": "terraform/modules/batch, https",
}
"""The targets whose jobs the infra stack lets out on HTTPS only (their security groups' egress rules)."""


def launcher_commit(root: Path | None = None) -> str:
    """The trainkit commit that launches the job (`-dirty` when its checkout has changes), else the version."""
    from trainkit import __version__

    root = root or Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode == 0 and head.stdout.strip():
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            return head.stdout.strip()[:12] + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return f"trainkit {__version__}"


PLACEHOLDER_SERVER = "arn:aws:sagemaker:us-east-1:000000000000:mlflow-tracking-server/trainkit-mlflow"


def stack_tracking(job: Job, infra) -> None:
    """A tracked job on an AWS target without --tracking-uri logs to the infra stack's SageMaker managed MLflow
    tracking server (`mlflow_enabled`, its `mlflow` output); the embedded store is this machine's."""
    t = job.tracking
    if not t.enabled or t.uri:
        return
    server = (infra.mlflow or {}).get("tracking_server_arn")
    if server:
        t.uri = server
        job.run.notes.append(f"tracking: the infra stack's SageMaker MLflow tracking server, {server}")
    elif not infra.recorded:
        t.uri = PLACEHOLDER_SERVER
        job.run.notes.append(
            "tracking: no infra stack recorded (`make up PROFILE=aws` records its MLflow tracking server): the "
            "server's ARN in this job is a placeholder"
        )
    else:
        raise SpecError(
            f"--track mlflow on --target {job.placement.target}: the infra stack has no MLflow tracking server; set "
            "mlflow_enabled = true and run `make up PROFILE=aws`, or give --tracking-uri (an https MLflow server the "
            "job's network reaches, or a SageMaker MLflow tracking server's ARN)"
        )
