"""`invoke secrets.*`: credentials the cluster targets' jobs need, taken from files, the environment or a prompt, never
a command line, and kept where those jobs read them (trainkit/run/secrets.py)."""

from __future__ import annotations

from invoke import Collection

from trainkit.backends.eks.cluster import JOBS_NAMESPACE
from trainkit.cli.options import task, user_errors

WHERE = {
    "namespace": f"EKS: namespace of the jobs (default {JOBS_NAMESPACE}).",
    "target": "eks (default: the cluster Secret), sagemaker or batch (the stack's Secrets Manager secret).",
}


def _store(name: str, file: str | None, namespace: str, target: str) -> None:
    from trainkit.backends import RunRef, get_backend
    from trainkit.run.secrets import CREDENTIALS, token_to_store

    (credential,) = (c for c in CREDENTIALS if c.name == name)
    backend = get_backend(target)  # refuses an unknown target before the token is asked for
    print(backend.put_secret(credential, token_to_store(credential, file), RunRef(namespace=namespace)))


@task(
    name="hf-token",
    help={
        "file": "File holding the token (default: HF_TOKEN, the Hugging Face CLI's token file, else a hidden prompt).",
        **WHERE,
    },
)
@user_errors
def hf_token(c, file=None, namespace=JOBS_NAMESPACE, target="eks"):
    """Store your Hugging Face token where the training jobs read it (never on a command line): the cluster Secret
    of the pods, or with --target sagemaker or batch the stack's Secrets Manager secret."""
    _store("hf-token", file, namespace, target)


@task(
    name="mlflow-token",
    help={"file": "File holding the token (default: MLFLOW_TRACKING_TOKEN, else a hidden prompt).", **WHERE},
)
@user_errors
def mlflow_token(c, file=None, namespace=JOBS_NAMESPACE, target="eks"):
    """Store a self-hosted MLflow tracking server's token where the training jobs read it as MLFLOW_TRACKING_TOKEN
    (jobs tracked to an http(s) --tracking-uri send it as a bearer token): the cluster Secret of the pods, or with
    --target sagemaker or batch the stack's Secrets Manager secret. A SageMaker managed tracking server needs none."""
    _store("mlflow-token", file, namespace, target)


collection = Collection("secrets", hf_token, mlflow_token)
