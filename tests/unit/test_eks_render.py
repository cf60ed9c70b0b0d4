"""EKS job rendering, in-process: what the rendered PyTorchJob holds, job names, and the flags refused
before anything is sent (the dry run, goldens and schema checks: tests/integration/test_eks_render_validated.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.crd import admission_errors
from tests.helpers.eks import ECR, container, job_for, worker
from training.common.lifecycle import STOP_GRACE_S
from trainkit.backends import job_from_flags as build_spec
from trainkit.backends.eks import cluster, render
from trainkit.infra import outputs
from trainkit.workloads.recipe import recipe


def test_c10d_uses_worker_0_and_each_submission_gets_its_own_rendezvous_id(recorded_outputs):
    spec = build_spec({"target": "eks", "model": "llama2-7b", "nodes": "1:2", "rdzv": "c10d"})
    first, second = (render.render_pytorchjob(spec, f"{spec.run.run_id}-{i}", recipe(spec)) for i in range(2))
    policy = first["spec"]["elasticPolicy"]
    name = first["metadata"]["name"]
    assert policy["rdzvBackend"] == "c10d" and policy["rdzvHost"] == f"{name}-worker-0"
    assert (policy["minReplicas"], policy["maxReplicas"]) == (1, 2)
    assert container(first)["args"] == [
        "--rdzv-endpoint",
        f"{name}-worker-0:{cluster.C10D_PORT}",
        "--rdzv-id",
        f"{spec.run.run_id}-0",
    ]
    assert policy["rdzvId"] != second["spec"]["elasticPolicy"]["rdzvId"]
    assert container(first)["image"] == f"{ECR}:{outputs.NOT_PUSHED_TAG}"  # recorded repository, nothing pushed
    secret_ref = {i["name"]: i for i in container(first)["env"]}["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert secret_ref["optional"] is True  # random init: the token only opens gated datasets


def test_pretrained_weights_require_the_secret(recorded_outputs):
    job = job_for({"model": "llama2-7b", "init": "pretrained"})
    secret_ref = {i["name"]: i for i in container(job)["env"]}["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert secret_ref["optional"] is False


def test_max_runtime_is_the_active_deadline_and_the_pods_grace_covers_the_stop(recorded_outputs):
    open_ended, timed = (job_for({"model": "llama2-7b", **flags}) for flags in ({}, {"max_runtime": "4h"}))
    assert "activeDeadlineSeconds" not in open_ended["spec"]["runPolicy"]
    assert timed["spec"]["runPolicy"] == {**open_ended["spec"]["runPolicy"], "activeDeadlineSeconds": 14400}
    assert admission_errors(timed) is None
    # Deleted at the deadline, a pod gets SIGTERM and this long before SIGKILL: the workers' own stop, a checkpoint
    # included, must fit in it.
    assert worker(timed)["template"]["spec"]["terminationGracePeriodSeconds"] > STOP_GRACE_S


def test_job_names_are_dns_labels_and_stay_distinct():
    assert render.job_name("llama2-7b-ff4e0196") == "llama2-7b-ff4e0196"
    odd = render.job_name("My_Run.v2")
    assert odd.startswith("my-run-v2-") and odd != render.job_name("my-run-v2")
    long = render.job_name("x" * 80)
    assert len(long) <= render.MAX_NAME and long[0].isalpha()
    assert render.job_name("7b").startswith("run-7b")


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"instance_type": "g5.xlarge"}, r"--instance-type 'g5.xlarge' is not in the instance table; choose one of: p"),
        ({"nproc": "16"}, r"--nproc 16: a p5.48xlarge node has 8 GPUs; use --nproc 1..8"),
        ({"runs_dir": "{tmp}/runs"}, r"--runs-dir {tmp}/runs: on EKS runs live on the FSx volume"),
        ({"dataset": "{tmp}/data.jsonl"}, r"--dataset {tmp}/data.jsonl: training pods read data from the FSx"),
    ],
)
def test_eks_flags_are_checked_before_anything_is_sent(recorded_outputs, tmp_path, flags, message):
    """Paths on this machine (outside the FSx mount) are refused; {tmp} is one found at run time."""
    from trainkit.errors import SpecError

    flags = {name: value.replace("{tmp}", str(tmp_path)) for name, value in flags.items()}
    with pytest.raises(SpecError, match=message.replace("{tmp}", re.escape(str(tmp_path)))):
        build_spec({"target": "eks", "model": "llama2-7b", **flags})


def test_aws_profile_targets_eks_with_etcd_and_runs_on_fsx(recorded_outputs):
    spec = build_spec({"model": "llama2-7b"}, profile="aws")
    assert (spec.placement.target, spec.elastic.rdzv, spec.placement.namespace) == (
        "eks",
        "etcd",
        cluster.JOBS_NAMESPACE,
    )
    assert spec.elastic.rdzv_endpoint == cluster.etcd_endpoint() and spec.parallelism.nproc == 8
    assert Path(spec.run.runs_dir) == Path("runs")  # relative to the FSx mount, the pods' working directory
