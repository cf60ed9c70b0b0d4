"""EKS jobs as the tests build and read them."""

from __future__ import annotations

import kubernetes_validate
import yaml

from tests.helpers.kubernetes import kubernetes_version
from trainkit.backends import job_from_flags as build_spec
from trainkit.backends.eks import submission
from trainkit.workloads.recipe import recipe

ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainkit/train"  # what recorded_outputs records
IMAGE = "registry.example.com/trainkit/train:test"  # not ECR: the image check only notes it


def job_for(flags: dict) -> dict:
    """The PyTorchJob a submission of these flags creates (trainkit/backends/eks/submission.py), its rendezvous id
    fixed, its parts' token too, and no rendezvous key (as a dry run's)."""
    job = build_spec({"target": "eks", **flags})
    return submission.job_objects(job, recipe(job), "fixed-rdzv-id", None, "0a1b2c3d4e", None)[1]


def worker(job: dict) -> dict:
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]


def container(job: dict) -> dict:
    return worker(job)["template"]["spec"]["containers"][0]


def validate_core(job: dict) -> None:
    """The pod template as a core PodTemplate, strictly (unknown fields fail)."""
    template = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "t"},
        "template": worker(job)["template"],
    }
    kubernetes_validate.validate(template, kubernetes_version(), strict=True)


def dry_run_objects(stdout: str) -> dict[str, dict]:
    """An EKS dry run's objects by kind (a NetworkPolicy, the rendezvous key's Secret, without its key, a ConfigMap
    when the workload brings code, the PyTorchJob), each checked in order: what the pods need before the job."""
    documents = list(yaml.safe_load_all(stdout))
    kinds = [document["kind"] for document in documents]
    assert kinds in (["NetworkPolicy", "Secret", "PyTorchJob"], ["NetworkPolicy", "Secret", "ConfigMap", "PyTorchJob"])
    secret = documents[1]
    assert not {"data", "stringData"} & set(secret), "a dry run prints no rendezvous key"
    for document in documents[:-1]:
        kubernetes_validate.validate(document, kubernetes_version(), strict=True)
    return dict(zip(kinds, documents, strict=True))


def dry_run_job(stdout: str) -> dict:
    """The PyTorchJob of an EKS dry run."""
    return dry_run_objects(stdout)["PyTorchJob"]
