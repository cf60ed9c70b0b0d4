"""`--target batch`'s requests, rendered in process: RegisterJobDefinition and SubmitJob as botocore's Batch service
model accepts them (tests/helpers/aws_model.py), the retry strategy as Batch evaluates it (the stand-in's rule,
tests/helpers/batch_standin.py), and what the backend refuses before anything is sent."""

from __future__ import annotations

import json
import random

import pytest

from tests.helpers.aws_model import problems
from tests.helpers.batch_standin import evaluate, matches
from trainkit import hardware
from trainkit.backends import resolve_job
from trainkit.backends.batch import request
from trainkit.backends.batch.backend import requests_for
from trainkit.backends.batch.stack import PLACEHOLDER
from trainkit.errors import SpecError
from trainkit.run.workload import Workload
from trainkit.workloads.recipe import recipe

SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:trainkit-hf-token-AbCdEf"


@pytest.fixture(autouse=True)
def no_stack_recorded(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))


def batch_job(**flags):
    return resolve_job({"target": "batch", "model": "bert-1.5b", "nodes": "16", **flags})[0]


@pytest.mark.parametrize("instance", list(hardware.INSTANCE_TYPES))
def test_every_instance_type_makes_requests_the_service_model_accepts(instance):
    job = batch_job(instance_type=instance)
    register, submit = requests_for(job, recipe(job), PLACEHOLDER, {"HF_TOKEN": SECRET})
    assert problems("batch", "RegisterJobDefinition", register) == []
    assert problems("batch", "SubmitJob", submit) == []
    properties = register["nodeProperties"]
    assert properties["numNodes"] == 16 and properties["mainNode"] == 0
    (nodes,) = properties["nodeRangeProperties"]
    container, spec = nodes["container"], hardware.INSTANCE_TYPES[instance]
    assert nodes["targetNodes"] == "0:" and container["instanceType"] == instance
    wanted = {r["type"]: int(r["value"]) for r in container["resourceRequirements"]}
    vcpus, memory = request.instance_host(instance)
    assert wanted == {"GPU": spec.gpus, "VCPU": vcpus, "MEMORY": int(memory * request.MEMORY_SHARE)}
    devices = container["linuxParameters"]["devices"]
    assert len(devices) == spec.efa_interfaces  # p5 32, p4d 4
    assert {d["hostPath"] for d in devices} == {f"/dev/infiniband/uverbs{i}" for i in range(spec.efa_interfaces)}
    assert all(d["permissions"] == ["READ", "WRITE", "MKNOD"] for d in devices)
    assert 0 < container["linuxParameters"]["sharedMemorySize"] < wanted["MEMORY"]
    assert container["ulimits"] == [{"name": "memlock", "softLimit": -1, "hardLimit": -1}]
    assert container["mountPoints"][0]["containerPath"] == "/fsx"
    assert container["volumes"][0]["host"]["sourcePath"] == "/fsx"
    assert container["secrets"] == [{"name": "HF_TOKEN", "valueFrom": SECRET}]
    options = {"awslogs-group": "/aws/batch/job", "awslogs-create-group": "true"}
    assert container["logConfiguration"] == {"logDriver": "awslogs", "options": options}
    assert submit["jobDefinition"] == register["jobDefinitionName"]


def test_the_host_table_covers_every_instance_type_of_the_instance_table():
    assert set(request.HOST_MEMORY_GIB) == set(hardware.INSTANCE_TYPES)
    assert all(request.instance_host(name)[0] > 0 for name in hardware.INSTANCE_TYPES)


def test_the_launch_values_are_the_spec_and_the_workload_and_hold_no_token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_neverInARequestNeverInARequest")
    job = batch_job()
    _, submit = requests_for(job, recipe(job), PLACEHOLDER, {"HF_TOKEN": SECRET})
    (override,) = submit["nodeOverrides"]["nodePropertyOverrides"]
    values = {e["name"]: e["value"] for e in override["containerOverrides"]["environment"]}
    assert json.loads(values[request.SPEC_ENV])["run"]["run_id"] == job.run.run_id
    assert json.loads(values["TRAINKIT_WORKLOAD"])["module"] == "training"
    assert "hf_neverInARequest" not in json.dumps(submit)
    assert submit["tags"] == {"trainkit:run-id": job.run.run_id, "trainkit:model": "bert-1.5b"}


def test_one_shape_one_definition_name_and_another_shape_another():
    job = batch_job()
    first = request.register_request(job, recipe(job), PLACEHOLDER, {})
    again = request.register_request(batch_job(steps="7"), recipe(job), PLACEHOLDER, {})  # what is trained
    other = request.register_request(batch_job(nodes="8"), recipe(job), PLACEHOLDER, {})
    assert first["jobDefinitionName"] == again["jobDefinitionName"]
    assert first["jobDefinitionName"].startswith("trainkit-p5-48xlarge-16x8-")
    assert other["jobDefinitionName"] != first["jobDefinitionName"]
    assert "secrets" not in first["nodeProperties"]["nodeRangeProperties"][0]["container"]


def test_retries_come_from_max_restarts_and_the_timeout_from_max_runtime():
    job = batch_job(max_restarts="2", max_runtime="4h")
    body = request.register_request(job, recipe(job), PLACEHOLDER, {})
    assert body["retryStrategy"]["attempts"] == 3 and body["timeout"] == {"attemptDurationSeconds": 14400}
    assert request.attempts(batch_job(max_restarts="40"), recipe(job)) == request.MAX_ATTEMPTS
    once = Workload(label="sweep", module="training.comms.sweep", restarts=False)
    assert request.retry_strategy(job, once) == {"attempts": 1}  # the sweep's first failure ends it


CASES = [
    # (statusReason, reason, exit code) of the main node -> what Batch does with the job's retry strategy
    (("Host EC2 (instance i-0a1b2c3d4e5f67890) terminated.", None, None), "RETRY"),  # the instance is gone
    (("Essential container in task exited", None, 192), "RETRY"),  # a peer lost, a worker failed: a new attempt
    (("Essential container in task exited", None, 3), "EXIT"),  # a failure every attempt repeats
    (("Essential container in task exited", None, 2), "EXIT"),  # the job cannot start
    (("Essential container in task exited", None, 1), "EXIT"),  # the entry point itself crashed
    (("Essential container in task exited", "OutOfMemoryError: Container killed due to memory usage", 137), "EXIT"),
    (("CannotPullContainerError: pull image manifest has been retried 5 time(s)", None, None), "EXIT"),
]


@pytest.mark.parametrize(("end", "action"), CASES)
def test_the_retry_strategy_retries_what_a_new_attempt_mends_and_exits_on_the_rest(end, action):
    job = batch_job()
    assert evaluate(request.retry_strategy(job, recipe(job)), *end) == action


def test_evaluate_on_exit_takes_the_first_match_and_retries_when_none_matches():
    strategy = {"evaluateOnExit": [{"onExitCode": "1*", "action": "exit"}, {"onExitCode": "137", "action": "RETRY"}]}
    assert evaluate(strategy, "x", None, 137) == "EXIT"  # the first entry that matches decides, case aside
    assert evaluate(strategy, "x", None, 2) == "RETRY"  # none matches: Batch retries
    assert evaluate({"attempts": 3}, "x", None, 1) == "RETRY"
    assert matches("Host EC2*", "Host EC2 (instance i-1) terminated.") and not matches("Host EC2*", None)
    assert matches("*", None) and matches("192", 192) and not matches("19", 192)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ({"nodes": "1:2"}, "a Batch multi-node job runs a fixed number of nodes"),
        ({"rdzv": "etcd"}, "a Batch job meets on its main node (c10d)"),
        ({"max_runtime": "30"}, "a Batch job's timeout is at least 60 s"),
        ({"dataset": "s3://corpora/wiki/"}, "Batch's nodes read data from the FSx volume at /fsx"),
        ({"runs_dir": "/tmp/runs"}, "on Batch runs live on the FSx volume every node mounts at /fsx"),
        ({"instance_type": "g5.48xlarge"}, "is not in the instance table; choose one of: p4d.24xlarge"),
        ({"namespace": "team-a"}, "--namespace team-a is for --target eks"),
        ({"nproc": "9"}, "--nproc 9: a p5.48xlarge node has 8 GPUs and each process takes one"),
    ],
)
def test_what_batch_cannot_do_is_refused_naming_the_flag(flags, said):
    with pytest.raises(SpecError, match=said.replace("(", r"\(").replace(")", r"\)")):
        batch_job(**flags)


def test_a_scripts_folder_travels_in_the_request_and_one_too_big_is_refused(tmp_path):
    folder = tmp_path / "code"
    (folder / "pkg").mkdir(parents=True)
    (folder / "train.py").write_text("print('hello')\n")
    (folder / "pkg" / "util.py").write_text("X = 1\n")
    packed = request.pack_code(folder)
    unpacked = request.unpack_code(packed, tmp_path / "node")
    assert (unpacked / "train.py").read_text() == "print('hello')\n" and (unpacked / "pkg" / "util.py").is_file()

    (folder / "weights.bin").write_bytes(random.Random(0).randbytes(50 * 1024))  # 50 KiB that do not compress
    job = batch_job()
    workload = Workload(label="train.py", script="runs/x/code/train.py", code=str(folder))
    with pytest.raises(SpecError, match="the SubmitJob request is .* KiB and AWS Batch takes at most 30 KiB"):
        requests_for(job, workload, PLACEHOLDER, {})
