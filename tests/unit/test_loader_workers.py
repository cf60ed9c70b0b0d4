"""The ImageNet recipes' loader workers on GPUs follow the node's CPUs (trainkit/job/derive.py, measured in
benchmarks/resnet50-workers-h200.json): vCPUs / processes less 2, between the recipe's 4 and 12, announced when
they differ from 4; unknown CPUs, CPU-only machines, resnet-tiny and a given --loader-workers keep their value."""

from __future__ import annotations

import importlib

import pytest

from trainkit.backends.base import cloud_machine
from trainkit.job import Machine, build, derive, validate

build_module = importlib.import_module("trainkit.job.build")  # the module; trainkit.job.build is the function


def on_instance(instance_type: str, profile: str = "local", **flags):
    """The job as a cloud target derives it: the node from the instance table."""
    job = build({"model": "resnet50", "target": "eks", "instance_type": instance_type, **flags}, profile)
    machine = cloud_machine(job, "image")
    derive(job, machine)
    validate(job, machine)
    return job


def on(machine: Machine, **flags):
    job = build({"model": "resnet50", "nproc": machine.gpus_per_node or 2, **flags})
    derive(job, machine)
    validate(job, machine)
    return job


def worker_notes(job) -> list[str]:
    return [note for note in job.run.notes if "loader workers a process" in note]


@pytest.mark.parametrize(
    "instance_type, workers, source",
    [("p5.48xlarge", 12, "192 vCPUs a node / 8 process(es)"), ("p4d.24xlarge", 10, "96 vCPUs a node / 8 process(es)")],
)
def test_a_cloud_node_sizes_the_workers_from_its_instance_vcpus(instance_type, workers, source):
    job = on_instance(instance_type)
    assert job.data.loader_workers == workers
    (note,) = worker_notes(job)
    assert note.startswith(f"{workers} loader workers a process: {source}, less 2, at most 12")
    assert "set --loader-workers to change it" in note


def test_fewer_processes_a_node_give_each_more_workers_up_to_12():
    assert on_instance("p4d.24xlarge", nproc="4").data.loader_workers == 12  # 96 / 4 - 2 = 22


@pytest.mark.parametrize("cpus, workers", [(8, 6), (6, 4), (4, 4)])
def test_a_small_gpu_node_keeps_at_least_the_recipes_4(cpus, workers):
    job = on(Machine(1, process_limit=1, described="1 GPU(s)", cpus_per_node=cpus))
    assert job.data.loader_workers == workers
    assert len(worker_notes(job)) == (workers != 4)  # announced only where it differs from the recipe's 4


def test_local_nodes_share_the_machines_cpus():
    machine = Machine(2, process_limit=2, described="2 GPU(s)", cpus_per_node=32)
    assert on(machine).data.loader_workers == 12  # 32 / 2 - 2 = 14
    assert on(machine, nodes="2", nproc="1").data.loader_workers == 12
    shared = Machine(4, process_limit=4, described="4 GPU(s)", cpus_per_node=32)
    assert on(shared, nodes="2", nproc="2").data.loader_workers == 6  # 32 / 4 - 2


def test_unknown_cpus_keep_the_recipes_4_without_a_note():
    job = on(Machine(8, described="8 GPUs"))
    assert job.data.loader_workers == 4 and not worker_notes(job)


def test_a_cpu_only_machine_keeps_the_cpu_recipes_1():
    job = on(Machine(0, process_limit=64, described="64 CPU core(s) and no GPU", cpus_per_node=64))
    assert job.data.loader_workers == 1 and not worker_notes(job)


def test_the_users_flag_or_profile_wins(monkeypatch):
    job = on_instance("p5.48xlarge", loader_workers="3")
    assert job.data.loader_workers == 3 and not worker_notes(job)
    monkeypatch.setattr(build_module, "load_profile", lambda name: {"target": "eks", "loader_workers": 16})
    job = on_instance("p5.48xlarge", profile="mine")
    assert job.data.loader_workers == 16 and not worker_notes(job)


def test_resnet_tiny_and_synthetic_input_keep_the_recipe_value():
    assert on_instance("p5.48xlarge", model="resnet-tiny").data.loader_workers == 1
    job = on_instance("p5.48xlarge", synthetic="true")  # no loader: nothing to size
    assert job.data.loader_workers == 4 and not worker_notes(job)
