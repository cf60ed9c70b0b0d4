"""`invoke secrets.*`: credentials the cluster needs, taken from files or a prompt, never a command line."""

from __future__ import annotations

from invoke import Collection, task

from trainkit.backends.eks.cluster import JOBS_NAMESPACE
from trainkit.cli.options import user_errors


@task(
    name="hf-token",
    help={
        "file": "File holding the token (default: HF_TOKEN, the Hugging Face CLI's token file, else a hidden prompt).",
        "namespace": f"EKS: namespace of the jobs (default {JOBS_NAMESPACE}).",
    },
)
@user_errors
def hf_token(c, file=None, namespace=JOBS_NAMESPACE):
    """Store your Hugging Face token as the cluster Secret the training pods read (never on a command line)."""
    from trainkit.backends.eks import backend as eks
    from trainkit.run.secrets import hf_token_to_store

    print(eks.put_hf_token(hf_token_to_store(file), namespace))


collection = Collection("secrets", hf_token)
