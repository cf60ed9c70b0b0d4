"""The SageMaker host entry point's reading of SageMaker's container contract (trainkit/backends/sagemaker/host.py):
its place in the job from resourceconfig.json, the failure file SageMaker shows, and the model from the first host
only."""

from __future__ import annotations

import pytest

from trainkit.backends import job_from_flags
from trainkit.backends.sagemaker import host
from trainkit.run.torchrun import Placement, PreparedRun, torchrun_command


def test_the_first_host_runs_the_store_and_every_host_is_reached_by_its_algo_name():
    config = {"current_host": "algo-2", "hosts": ["algo-1", "algo-2", "algo-10"], "network_interface_name": "eth0"}
    assert host.placement(config) == ("algo-2", "algo-1:29400", Placement(is_host=False, local_addr="algo-2"))
    first = host.placement({**config, "current_host": "algo-1"})[2]
    assert first == Placement(is_host=True, local_addr="algo-1")
    # the first of `hosts` as given, not as sorted: algo-10 after algo-2 hosts nothing
    assert host.placement({**config, "hosts": ["algo-2", "algo-10", "algo-1"], "current_host": "algo-1"})[2:] == (
        Placement(is_host=False, local_addr="algo-1"),
    )


def test_the_torchrun_command_carries_the_placement(tmp_path):
    config = {"current_host": "algo-2", "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth0"}
    _, endpoint, place = host.placement(config)
    command = torchrun_command(
        PreparedRun(job_from_flags({"nodes": 2, "nproc": 1, "rdzv": "c10d"}), ["-m", "x"]),
        endpoint,
        "id",
        tmp_path,
        place,
    )
    assert command[command.index("--local-addr") + 1] == "algo-2"
    assert command[command.index("--rdzv-endpoint") + 1] == "algo-1:29400"
    assert "is_host=false" in command[command.index("--rdzv-conf") + 1]


def test_nccl_and_gloo_use_the_interface_resourceconfig_names():
    config = {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "ens33"}
    assert host.interface_env(config) == {"NCCL_SOCKET_IFNAME": "ens33", "GLOO_SOCKET_IFNAME": "ens33"}
    assert host.interface_env({"current_host": "algo-1", "hosts": ["algo-1"]}) == {}


def test_a_host_outside_the_list_is_refused():
    with pytest.raises(ValueError, match="current_host 'algo-3' is not among hosts"):
        host.placement({"current_host": "algo-3", "hosts": ["algo-1", "algo-2"]})


def test_the_failure_file_holds_the_cause_cut_to_what_sagemaker_shows(tmp_path, monkeypatch):
    monkeypatch.setenv(host.ROOT_ENV, str(tmp_path))
    host.report_failure("algo-1: rank 0: no space left on device " + "x" * 2000)
    written = (tmp_path / "output" / "failure").read_text()
    assert written.startswith("algo-1: rank 0: no space left") and len(written) == host.FAILURE_LIMIT


def test_the_host_that_holds_the_export_publishes_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv(host.ROOT_ENV, str(tmp_path / "ml"))
    run = tmp_path / "run"
    run.mkdir()
    host.publish_model(run)  # a host whose ranks did not export (rank 0 ran elsewhere)
    assert not (tmp_path / "ml" / "model").exists()
    (run / "model").mkdir()
    (run / "model" / "config.json").write_text("{}")
    host.publish_model(run)
    assert (tmp_path / "ml" / "model" / "config.json").read_text() == "{}"


def test_no_secret_named_means_no_token_and_no_call():
    assert host.secret_env(None, "HF_TOKEN") == {}


def test_the_token_is_read_in_the_secrets_own_region_whatever_the_environment_says(monkeypatch):
    """Issue 47: the host's Secrets Manager client had no region of its own (none in a SageMaker container's
    documented environment): it takes the one the secret's ARN names."""
    import boto3

    made = {}

    class Client:
        exceptions = type("E", (), {"ResourceNotFoundException": KeyError})

        def get_secret_value(self, SecretId):  # noqa: N803 (botocore's name)
            return {"SecretString": " hf_abc \n"}

    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setattr(boto3, "client", lambda service, **kwargs: made.update(service=service, **kwargs) or Client())
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:hf-token-AbCdEf"
    assert host.secret_env(arn, "HF_TOKEN") == {"HF_TOKEN": "hf_abc"}
    assert made == {"service": "secretsmanager", "region_name": "eu-west-1"}


def test_the_launchers_run_folder_becomes_this_hosts_in_arguments_script_and_environment():
    from trainkit.run.workload import Workload

    submitted, here = "/opt/ml/checkpoints/lit", "/tmp/job/algo-2/opt/ml/checkpoints/lit"
    workload = Workload(
        label="lightning_ddp.py",
        script=f"{submitted}/code/4186/lightning_ddp.py",
        args=("--out", f"{submitted}/out", "--steps", "20", f"{submitted}-other"),
        env={"TRAINKIT_CHECKPOINT_DIR": f"{submitted}/checkpoints", "TRAINKIT_SCRIPT": "lightning_ddp.py"},
    )
    moved = host.relocated(workload, submitted, here)
    assert moved.script == f"{here}/code/4186/lightning_ddp.py"
    assert moved.args == ("--out", f"{here}/out", "--steps", "20", f"{submitted}-other")  # only the folder itself
    assert moved.env == {"TRAINKIT_CHECKPOINT_DIR": f"{here}/checkpoints", "TRAINKIT_SCRIPT": "lightning_ddp.py"}
    recipe = Workload(label="llama2-tiny", module="training", args=("--spec", f"{submitted}/spec.json"))
    assert host.relocated(recipe, submitted, here).script is None


@pytest.mark.parametrize(
    ("dataset", "lands", "reads"),
    [
        ("s3://data/imagenet/", "train", "mount"),  # a prefix: its objects under the channel
        ("s3://data/imagenet", "imagenet/train", "mount/imagenet"),  # if the last part lands as a folder
        ("s3://data/imagenet", "train", "mount"),  # if it does not
        ("s3://data/chat/train.jsonl", "train.jsonl", "mount/train.jsonl"),  # one object, under its own name
        ("/fsx/imagenet", "train", "/fsx/imagenet"),  # not from S3: as given
    ],
)
def test_an_s3_dataset_is_read_where_the_target_mounted_it(tmp_path, monkeypatch, dataset, lands, reads):
    from training.spec import DATA_MOUNT_ENV, Job, dataset_path

    mount = tmp_path / "mount"
    (mount / lands).parent.mkdir(parents=True, exist_ok=True)
    (mount / lands).write_text("") if lands.endswith(".jsonl") else (mount / lands).mkdir()
    monkeypatch.setenv(DATA_MOUNT_ENV, str(mount))
    job = Job()
    job.data.dataset = dataset
    assert dataset_path(job) == (reads if reads.startswith("/") else str(tmp_path / reads))
    monkeypatch.delenv(DATA_MOUNT_ENV)
    assert dataset_path(job) == dataset  # elsewhere (no mount) the spec's value is the path
