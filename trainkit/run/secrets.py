"""The credentials a job may need, and the Hugging Face token's lookup. A credential is only ever passed on in a
child's environment, or kept where a cluster target's jobs read it (`invoke secrets.<name>`): never a flag, a spec
field, a manifest value or a log line.

The Hugging Face token's sources, first found wins: the file given by --hf-token-file (what the user asked for on
this command wins over the environment), the HF_TOKEN environment variable, the file named by HF_TOKEN_PATH, then
the Hugging Face CLI's default `~/.cache/huggingface/token`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trainkit.errors import SpecError


@dataclass(frozen=True)
class Credential:
    """A credential the jobs read from their environment, kept on a cluster target where its jobs get it: the EKS
    Secret `name` (key `token`), or the infra stack's Secrets Manager secret (its ARN the stack output `stack_key`
    of the SageMaker and Batch modules)."""

    name: str
    env: str
    what: str
    stack_key: str
    readers: str
    """Which jobs read it, as `invoke secrets.<name>` says once it is stored."""

    @property
    def arn_env(self) -> str:
        """The variable that names its secret's ARN to a SageMaker host (trainkit/backends/sagemaker/host.py), which
        reads the value itself: a training job's environment holds no secret value."""
        return f"TRAINKIT_{self.env}_SECRET_ARN"


HF_TOKEN = Credential(
    "hf-token", "HF_TOKEN", "Hugging Face token", "hf_token_secret_arn", "jobs with --init pretrained read it"
)
# MLflow's client sends MLFLOW_TRACKING_TOKEN as a bearer token with every request to an http(s) server
# (mlflow/utils/credentials.py reads it into MlflowHostCreds.token, mlflow/utils/rest_utils.py sends it); a SageMaker
# managed server's requests are signed with the job's IAM role instead.
MLFLOW_TOKEN = Credential(
    "mlflow-token",
    "MLFLOW_TRACKING_TOKEN",
    "MLflow tracking server's token",
    "mlflow_token_secret_arn",
    "jobs tracked to an http(s) --tracking-uri send it",
)
CREDENTIALS = (HF_TOKEN, MLFLOW_TOKEN)


def sends_token(job) -> bool:
    """Whether the job's workers send MLflow a token (MLFLOW_TRACKING_TOKEN, from the target's secret when it holds
    one): to an http(s) server, never to a SageMaker managed one, whose requests the job's IAM role signs."""
    return job.tracking.enabled and (job.tracking.uri or "").lower().startswith(("http://", "https://"))


def job_credentials(job, workload) -> tuple[Credential, ...]:
    """The credentials a cluster job gets, where its target keeps them: the Hugging Face token for a workload that may
    read it, the MLflow token for a job tracked to an http(s) server."""
    return tuple(c for c, needs in ((HF_TOKEN, workload.token), (MLFLOW_TOKEN, sends_token(job))) if needs)


def _token_files() -> list[Path]:
    candidates = []
    if os.environ.get("HF_TOKEN_PATH"):
        candidates.append(Path(os.environ["HF_TOKEN_PATH"]).expanduser())
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")).expanduser()
    candidates.append(hf_home / "token")
    return candidates


def resolve_hf_token(token_file: str | None = None) -> str | None:
    if token_file:
        path = Path(token_file).expanduser()
        if not path.is_file():
            raise SpecError(f"--hf-token-file {token_file} does not exist; write your token there or set HF_TOKEN")
        if not path.read_text().strip():
            raise SpecError(f"--hf-token-file {token_file} is empty; write your token there or set HF_TOKEN")
        return path.read_text().strip()
    if os.environ.get("HF_TOKEN", "").strip():
        return os.environ["HF_TOKEN"].strip()
    for path in _token_files():
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
    return None


def require_hf_token(weights: str, token_file: str | None) -> str:
    token = resolve_hf_token(token_file)
    if token is None:
        raise SpecError(
            f"--init pretrained downloads {weights} from the Hugging Face hub, which needs an access token: "
            "set HF_TOKEN in the environment, or write the token to ~/.cache/huggingface/token "
            "(or a file passed with --hf-token-file). Never pass the token itself on the command line."
        )
    return token


def token_to_store(credential: Credential, token_file: str | None) -> str:
    """The credential from a file, its environment variable (for the Hugging Face token, also its CLI's file) or a
    hidden prompt, never from the command line, for the place a cluster target's jobs read it (`invoke secrets.*`)."""
    import getpass
    import sys

    if credential is HF_TOKEN:
        token = resolve_hf_token(token_file)
    elif token_file:
        path = Path(token_file).expanduser()
        if not path.is_file():
            raise SpecError(f"--file {token_file} does not exist; write the {credential.what} there")
        token = path.read_text().strip()
    else:
        token = os.environ.get(credential.env, "").strip() or None
    if token is None:
        if not sys.stdin.isatty():
            raise SpecError(f"no {credential.what} found: pass --file with a file holding it, or set {credential.env}")
        token = getpass.getpass(f"{credential.what} (input hidden): ").strip()
    if not token:
        raise SpecError(f"the {credential.what} is empty; nothing was stored")
    return token
