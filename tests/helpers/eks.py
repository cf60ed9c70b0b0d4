"""EKS jobs as the tests build and read them."""

from __future__ import annotations

from trainkit.backends import job_from_flags as build_spec
from trainkit.backends.eks import render

ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainkit/train"  # what recorded_outputs records
IMAGE = "registry.example.com/trainkit/train:test"  # not ECR: the image check only notes it


def job_for(flags: dict) -> dict:
    return render.render_pytorchjob(build_spec({"target": "eks", **flags}), "fixed-rdzv-id")


def worker(job: dict) -> dict:
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]


def container(job: dict) -> dict:
    return worker(job)["template"]["spec"]["containers"][0]
