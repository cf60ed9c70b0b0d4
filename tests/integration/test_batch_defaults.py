"""Every model's recipe works at every node count the instance table allows, without a batch flag.

The recipe's global batch is a target (trainkit/job/derive.py, choose_global_batch): each process takes a
whole number of sequences, the batch that results is announced and the learning rate follows it. Each
job below is rendered for EKS and admitted as training-operator v1.9.4 admits it (its CRD schema,
strictly, and its webhook: tests/helpers/crd.py).
"""

from __future__ import annotations

import pytest

from tests.helpers.crd import admission_errors
from tests.helpers.eks import container, dry_run_job, worker
from tests.helpers.product import invoke
from training.spec import micro_steps, share
from trainkit import hardware
from trainkit.backends import job_from_flags
from trainkit.backends.eks import render
from trainkit.job.models import REGISTRY
from trainkit.workloads.recipe import recipe as recipe_workload

NODE_COUNTS = [str(n) for n in range(1, 17)] + [f"1:{n}" for n in range(2, 17)] + ["2:4", "4:16"]


def sizes(job) -> list[int]:
    p = job.parallelism
    return [nodes * p.nproc for nodes in range(p.min_nodes, p.nodes + 1)]


@pytest.mark.parametrize("model", sorted(REGISTRY))
def test_the_recipe_gives_a_valid_job_at_every_node_count(model):
    recipe = REGISTRY[model].recipe
    for instance_type, instance in hardware.INSTANCE_TYPES.items():
        for nodes in NODE_COUNTS:
            flags = {"model": model, "target": "eks", "nodes": nodes, "instance_type": instance_type, "run_id": "b"}
            job = job_from_flags(flags, profile="aws")
            o, where = job.optimisation, f"{model} on {nodes} x {instance_type}"
            manifest = render.render_pytorchjob(job, "fixed-rdzv-id", recipe_workload(job))
            assert admission_errors(manifest) is None, (where, admission_errors(manifest))
            limits = container(manifest)["resources"]["limits"]
            assert (limits["nvidia.com/gpu"], limits["vpc.amazonaws.com/efa"]) == (
                str(instance.gpus),
                str(instance.efa_interfaces),
            )
            assert worker(manifest)["replicas"] == job.parallelism.nodes
            assert o.micro_batch_size <= recipe.micro_batch_size, where
            largest = max(sizes(job))
            assert o.global_batch_size % largest == 0, where  # whole sequences per process at the full size
            for world in sizes(job):
                shares = [share(o.global_batch_size, world, rank)[1] for rank in range(world)]
                assert min(shares) >= 1 and max(shares) - min(shares) <= 1, (where, world)
                steps = micro_steps(o.global_batch_size, o.micro_batch_size, world)
                if job.model.family == "vision":  # no empty micro batch (BatchNorm)
                    assert min(shares) >= steps, (where, world)
            if o.global_batch_size != recipe.global_batch_size:
                assert any(f"the recipe's {recipe.global_batch_size} rounded" in note for note in job.run.notes), where


def test_a_moved_batch_is_announced_with_the_learning_rate_it_implies():
    job = job_from_flags({"model": "llama2-70b", "target": "eks", "nodes": "16", "run_id": "b"}, profile="aws")
    assert job.optimisation.global_batch_size == 128 and job.optimisation.micro_batch_size == 1
    assert job.optimisation.lr == pytest.approx(2e-5 * 2**0.5, rel=1e-2)  # square-root rule, 64 -> 128
    note = next(n for n in job.run.notes if n.startswith("global batch 128"))
    assert "1 per process x 128 processes" in note and "square-root rule" in note
    given = job_from_flags({"model": "llama2-70b", "target": "eks", "nodes": "16", "lr": 1e-5}, profile="aws")
    assert given.optimisation.lr == 1e-5  # a given rate is the user's


def test_the_dry_run_of_a_wide_elastic_range_prints_an_admissible_job(tmp_path):
    env = {"TRAINKIT_STATE_DIR": str(tmp_path / "state"), "KUBECONFIG": str(tmp_path / "none")}
    flags = ["--model", "llama2-70b", "--target", "eks", "--nodes", "4:16", "--dry-run"]
    result = invoke("train", *flags, env=env)
    assert result.returncode == 0, result.stderr
    assert "global batch 128: the recipe's 64 rounded to 1 per process x 128 processes" in result.stderr
    job = dry_run_job(result.stdout)
    assert admission_errors(job) is None, admission_errors(job)
    assert (job["spec"]["elasticPolicy"]["minReplicas"], job["spec"]["elasticPolicy"]["maxReplicas"]) == (4, 16)
    limits = container(job)["resources"]["limits"]
    assert (limits["nvidia.com/gpu"], limits["vpc.amazonaws.com/efa"]) == ("8", "32")


def test_an_explicit_batch_that_does_not_split_is_still_refused(tmp_path):
    result = invoke(
        "train",
        "--model",
        "llama2-70b",
        "--target",
        "eks",
        "--nodes",
        "16",
        "--global-batch-size",
        "64",
        "--dry-run",
        env={"TRAINKIT_STATE_DIR": str(tmp_path / "state"), "KUBECONFIG": str(tmp_path / "none")},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--global-batch-size 64 is not divisible by --micro-batch-size 1 x 128 processes = 128" in result.stderr
