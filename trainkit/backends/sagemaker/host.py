"""Entry point on every instance ("host") of a SageMaker training job: find this host's place in the job, run the
workload through torchrun (trainkit/run/node.py, as an EKS pod does), put the exported model where SageMaker packs
it, and leave a failure's cause where SageMaker shows it.

What SageMaker gives the container (Developer Guide, "Containers with custom training algorithms": "How Amazon
SageMaker AI Provides Training Information" and "How Amazon SageMaker AI Processes Training Output"):

    /opt/ml/input/config/resourceconfig.json   current_host ("algo-2"), hosts (["algo-1", "algo-2"]) ...
    /opt/ml/input/data/<channel>/              each input channel; `trainkit` holds spec.json, workload.json and
                                               a script's code, `data` the s3:// dataset the job named
                                               (trainkit/backends/sagemaker/request.py)
    /opt/ml/checkpoints                        synced with the job's checkpoint S3 prefix (the run folder)
    /opt/ml/model                              packed into model.tar.gz under the output path when the job ends;
                                               containers must not write clashing names there, so host 1 alone
                                               writes the model
    /opt/ml/output/failure                     its text becomes the job's FailureReason

The hosts meet on the first host of `hosts` (a c10d store there; the job name is the rendezvous id, so a spot
restart, which restarts the same job on fresh instances, meets afresh). Everything comes from resourceconfig.json,
as AWS's own torchrun launcher takes it (sagemaker-training-toolkit, src/sagemaker_training/torch_distributed.py:
`--master_addr algo-1 --node_rank <index in hosts>`, NCCL_SOCKET_IFNAME = network_interface_name): the `algo-N`
names resolve on every host, but the container's own hostname is not its `algo-N` name (AWS's images patch
gethostname() for that: the toolkit's src/sagemaker_training/c/gethostname.c), so this host tells torchrun so
itself: the first host runs the store (`is_host`), and each host's address in the rendezvous is its `algo-N`
name (`--local-addr`), which becomes MASTER_ADDR when it holds group rank 0. Without it, a host's workers are
handed another's fqdn, which only that host resolves. NCCL's and gloo's sockets use the interface
resourceconfig.json names (a user's torchrun on SageMaker whose NCCL picked 169.254.x.x failed:
ultralytics/yolov5#12811). The Hugging Face token is read from Secrets Manager by the ARN in the environment and
handed to this host's processes only.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from training.common.checkpoint import HOST_ENV, HOSTS_ENV
from training.spec import DATA_MOUNT_ENV, EVAL_MOUNT_ENV, SPEC_FILE, WEIGHTS_MOUNT_ENV, read_job
from trainkit.backends.sagemaker import restore
from trainkit.backends.sagemaker.request import DATA_CHANNEL, EVAL_CHANNEL, REGION_ENV, WEIGHTS_CHANNEL
from trainkit.backends.sagemaker.restore import CHECKPOINT_S3_ENV
from trainkit.run.agent import RESTART_HOOK_ENV
from trainkit.run.node import run_node
from trainkit.run.secrets import job_credentials
from trainkit.run.torchrun import Placement
from trainkit.run.workload import WORKLOAD_FILE, Workload

ROOT_ENV = "TRAINKIT_SAGEMAKER_ROOT"
"""Where /opt/ml is when not there (the tests' stand-in gives every host a tree of its own)."""
RDZV_PORT = 29400
FAILURE_LIMIT = 1024  # SageMaker shows the failure file's first 1,024 characters


def root() -> Path:
    return Path(os.environ.get(ROOT_ENV, "/opt/ml"))


def placement(resource_config: dict) -> tuple[str, str, Placement]:
    """(this host's name, the rendezvous endpoint on the first host, its placement) from resourceconfig.json."""
    hosts, current = resource_config["hosts"], resource_config["current_host"]
    if current not in hosts:
        raise ValueError(f"resourceconfig.json: current_host {current!r} is not among hosts {hosts}")
    return current, f"{hosts[0]}:{RDZV_PORT}", Placement(is_host=current == hosts[0], local_addr=current)


def interface_env(resource_config: dict) -> dict[str, str]:
    """NCCL's and gloo's socket interface: the one between the hosts, as resourceconfig.json names it (the image's
    default, every interface but loopback and container links, may pick SageMaker's 169.254.x.x one)."""
    name = resource_config.get("network_interface_name")
    return {"NCCL_SOCKET_IFNAME": name, "GLOO_SOCKET_IFNAME": name} if name else {}


def report_failure(line: str) -> None:
    path = root() / "output" / "failure"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(line[:FAILURE_LIMIT])


def secret_env(arn: str | None, name: str) -> dict[str, str]:
    """`name` for this host's processes, from the Secrets Manager secret `arn` (nothing when the job names no secret,
    or the secret holds no value)."""
    if not arn:
        return {}
    import boto3

    # In the secret's own region, which its ARN names (arn:partition:secretsmanager:region:account:secret:name): a
    # SageMaker container's environment is not documented to carry one, and without it boto3 has no region at all.
    client = boto3.client("secretsmanager", region_name=arn.split(":")[3])
    try:
        value = client.get_secret_value(SecretId=arn)["SecretString"].strip()
    except client.exceptions.ResourceNotFoundException:  # no value stored: the run does without (the launcher's
        return {}  # preflight refused --init pretrained in that case)
    return {name: value} if value else {}


def publish_model(run_dir: Path) -> None:
    """The run's exported model into /opt/ml/model (SageMaker merges the hosts' folders into model.tar.gz). Only
    the host of global rank 0 has it, as the rank that exports: the rendezvous, not the host's name, decides which
    host that is, so every host looks (the stand-in found the leader on algo-2)."""
    exported = run_dir / "model"
    if exported.is_dir():
        shutil.copytree(exported, root() / "model", dirs_exist_ok=True)


def relocated(workload: Workload, submitted: str, here: str) -> Workload:
    """The workload with the run folder the launcher wrote into it (the spec's path and an output folder in its
    arguments, a script's copied file, the checkpoint folder in its environment) pointing at this host's: the same
    path on SageMaker (/opt/ml/checkpoints/<run-id>), another one where /opt/ml is elsewhere (ROOT_ENV)."""

    def moved(value: str) -> str:
        return here + value[len(submitted) :] if value == submitted or value.startswith(submitted + "/") else value

    return replace(
        workload,
        args=tuple(moved(arg) for arg in workload.args),
        script=moved(workload.script) if workload.script else None,
        env={name: moved(value) for name, value in workload.env.items()},
    )


def main() -> int:
    base = root()
    if os.environ.get(REGION_ENV):  # the job's region, for this host's boto3 clients (restore.py's S3)
        os.environ.setdefault("AWS_DEFAULT_REGION", os.environ[REGION_ENV])
    resources = json.loads((base / "input" / "config" / "resourceconfig.json").read_text())
    host, endpoint, place = placement(resources)
    hosts = resources["hosts"]
    launch = base / "input" / "data" / os.environ.get("TRAINKIT_LAUNCH_CHANNEL", "trainkit")
    job = read_job(launch / SPEC_FILE)
    workload = Workload.from_json((launch / WORKLOAD_FILE).read_text())
    if workload.code is not None:
        workload = replace(workload, code=str(launch / "code"))
    submitted = str(job.run_dir)
    job.run.runs_dir = str(base / "checkpoints")
    mounts = ((DATA_CHANNEL, DATA_MOUNT_ENV), (EVAL_CHANNEL, EVAL_MOUNT_ENV), (WEIGHTS_CHANNEL, WEIGHTS_MOUNT_ENV))
    for name, variable in mounts:
        channel = base / "input" / "data" / name
        if channel.is_dir():  # the s3:// data the job named, as SageMaker mounts it (FastFile)
            os.environ[variable] = str(channel)
    workload = relocated(workload, submitted, str(job.run_dir))
    rdzv_id = os.environ.get("TRAINING_JOB_NAME", job.run.run_id)
    for credential in job_credentials(job, workload):  # this host's processes only, as a Secret is a pod's env on EKS
        os.environ.update(secret_env(os.environ.get(credential.arn_env), credential.env))
    os.environ.update(interface_env(resources))
    # The hosts share no filesystem: checkpoints publish per host (training/common/checkpoint.py). Before torchrun
    # restarts the workers in place, each host fetches the others' parts from the checkpoint prefix (restore.py); a
    # job from before that prefix was in its environment ends at its first failure instead.
    os.environ.update({HOST_ENV: host, HOSTS_ENV: ",".join(hosts)})
    if os.environ.get(CHECKPOINT_S3_ENV):
        os.environ[RESTART_HOOK_ENV] = f"{restore.__name__}:before_restart"
    else:
        workload = replace(workload, restarts=False)
    code = run_node(job, workload, endpoint, rdzv_id, host, report_failure, place)
    if code == 0:
        publish_model(job.run_dir)
    return code


if __name__ == "__main__":
    sys.exit(main())
