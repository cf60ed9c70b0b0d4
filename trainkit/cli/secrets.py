"""`invoke secrets.*`: credentials the cluster needs, taken from files or a prompt, never a command line."""

from __future__ import annotations

from invoke import Collection

from trainkit.backends.eks.cluster import JOBS_NAMESPACE
from trainkit.cli.options import task, user_errors


@task(
    name="hf-token",
    help={
        "file": "File holding the token (default: HF_TOKEN, the Hugging Face CLI's token file, else a hidden prompt).",
        "namespace": f"EKS: namespace of the jobs (default {JOBS_NAMESPACE}).",
        "target": "eks (default: the cluster Secret), sagemaker or batch (the stack's Secrets Manager secret).",
    },
)
@user_errors
def hf_token(c, file=None, namespace=JOBS_NAMESPACE, target="eks"):
    """Store your Hugging Face token where the training jobs read it (never on a command line): the cluster Secret
    of the pods, or with --target sagemaker or batch the stack's Secrets Manager secret."""
    from trainkit.backends import RunRef, get_backend
    from trainkit.run.secrets import hf_token_to_store

    backend = get_backend(target)  # refuses an unknown target before the token is asked for
    print(backend.put_hf_token(hf_token_to_store(file), RunRef(namespace=namespace)))


collection = Collection("secrets", hf_token)
