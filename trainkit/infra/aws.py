"""The aws profile: `infra.plan|up|down|outputs|audit` over the infra stack, with boto3 checks.

Cloud-only facts (real capacity, quotas, prices) cannot be proven offline; the emulator test
(tests/e2e/test_infra_e2e.py) drives this module against moto on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from trainkit.errors import SpecError
from trainkit.infra.outputs import BATCH_ACTIVE, STACK_TAG, aws_state_dir, load_outputs
from trainkit.infra.terraform import PlanSummary, TerraformStack
from trainkit.paths import make_folder, terraform_dir
from trainkit.plan.prices import Price, PriceBook, Standing, plan_region

# Apply order; teardown runs it backwards (the platform stack lives on the cluster the infra makes).
STACK_ORDER = ("infra", "platform")


def stacks_dir() -> Path:
    return terraform_dir() / "stacks"


def default_var_file() -> Path:
    return stacks_dir() / "infra" / "terraform.tfvars"


def resolve_var_file(var_file: str | None) -> Path:
    path = Path(var_file).expanduser().resolve() if var_file else default_var_file()
    if not path.is_file():
        example = default_var_file().with_name("terraform.tfvars.example")
        raise SpecError(
            f"{path} does not exist: copy {_shown(example)} to {_shown(default_var_file())} "
            "and edit it (or pass --var-file)"
        )
    return path


def _shown(path: Path) -> Path:
    """A path as the user typed it: relative to where the command runs when it is below it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def _unquote(value):
    if isinstance(value, str):
        return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
    if isinstance(value, list):
        return [_unquote(v) for v in value]
    if isinstance(value, dict):
        return {k: _unquote(v) for k, v in value.items()}
    return value


def read_tfvars(path: Path) -> dict:
    """Values set in a .tfvars file (python-hcl2 keeps string quotes; they are removed here)."""
    import hcl2

    with path.open() as handle:
        data = hcl2.load(handle)
    return {k: _unquote(v) for k, v in data.items() if not k.startswith("__")}


def stack_identity(var_file: Path) -> tuple[str, str, str]:
    """(stack_id, region, name) as the stack tags and names its resources."""
    values = read_tfvars(var_file)
    if "region" not in values:
        raise SpecError(f"{var_file} does not set region")
    return values.get("stack_id", "trainkit"), values["region"], values.get("name", "trainkit")


def check_credentials() -> dict:
    """Fail with one sentence when no usable AWS credentials are configured."""
    try:
        return boto3.client("sts", region_name=os.environ.get("AWS_REGION", "us-east-1")).get_caller_identity()
    except NoCredentialsError:
        raise SpecError(
            "no AWS credentials found: set AWS_PROFILE (e.g. after `aws sso login`) or "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, then run this again"
        ) from None
    except (ClientError, BotoCoreError) as error:
        raise SpecError(f"AWS rejected the configured credentials ({error}); refresh them and run this again") from None


def stack(name: str = "infra") -> TerraformStack:
    state = aws_state_dir()
    if name == "infra":
        return TerraformStack(stacks_dir() / name, state)
    # Later stacks read the infra stack's outputs from its state file (terraform_remote_state).
    env = {"TF_VAR_infra_state_path": str(state / "terraform.tfstate")}
    # The idle guard's CronJob runs the guard's image `make up` pushed last to its repository (none: no CronJob).
    guard_image = load_outputs().idle_guard_image
    if guard_image:
        env["TF_VAR_idle_guard_image"] = guard_image
    return TerraformStack(stacks_dir() / name, state / name, extra_env=env)


def teardown_order() -> list[str]:
    """Stacks present in the repository, last applied first."""
    return [name for name in reversed(STACK_ORDER) if any((stacks_dir() / name).glob("*.tf"))]


@dataclass
class CostEstimate:
    """The stack's cost per hour, priced as `invoke plan` prices an EKS job (trainkit/plan/prices.py)."""

    instance_type: str
    nodes: int
    price: Price | None
    standing: list[Standing]

    def describe(self) -> str:
        parts = "; ".join(f"{s.what} ${s.usd_per_hour:,.3f} ({s.source})" for s in self.standing)
        rest = f"standing ${sum(s.usd_per_hour for s in self.standing):,.2f}/hour: {parts}; EBS, S3 and data transfer "
        rest += "come on top"
        if self.price is None:
            return f"GPU nodes: {self.nodes} x {self.instance_type} (no price known: `invoke infra.prices`); {rest}"
        price = f"(on-demand, {self.price.source})"
        if not self.nodes:
            return (
                f"Estimated cost: no GPU node at first; ${self.price.usd:,.2f}/hour for each {self.instance_type} "
                f"while a job has it {price}; {rest}"
            )
        total = self.price.usd * self.nodes
        return f"Estimated cost: ${total:,.2f}/hour for {self.nodes} x {self.instance_type} {price}; {rest}"


def estimate_cost(plan: PlanSummary) -> CostEstimate:
    variables = plan.variables
    instance_type = variables.get("gpu_instance_type", "p5.48xlarge")
    nodes = int(variables.get("gpu_desired_nodes", 0))
    book = PriceBook(plan_region(variables.get("region")))
    fsx = (variables.get("fsx_storage_capacity_gib"), variables.get("fsx_throughput_per_tib"))
    standing = book.standing(*(fsx if variables.get("enable_fsx", True) else (None, None)))
    return CostEstimate(instance_type, nodes, book.instance_hour("eks", instance_type), standing)


def describe_gpu_nodes(variables: dict) -> str:
    """How the plan's GPU node group gets its nodes and gives them back, from the infra stack's variables (a plan's
    values, defaults included): created empty by default, asked for nodes by each `invoke train --target eks`
    (trainkit/backends/eks/nodegroup.py), emptied again by the idle guard when it runs (it needs pod identity)."""
    desired, most = int(variables.get("gpu_desired_nodes") or 0), variables.get("gpu_max_nodes")
    guard = variables.get("idle_guard_minutes") if variables.get("enable_pod_identity", True) else None
    created = (
        "created with no nodes, so `make up` waits for no GPU capacity"
        if not desired
        else f"created with {desired} node(s), which `make up` waits for (it fails if EC2 has no capacity for them)"
    )
    back = (
        f"the idle guard scales it to zero after {guard} minutes with no job and idle GPUs"
        if guard
        else "nothing scales it down (the idle guard is off): scale it to 0 when you are done"
    )
    return (
        f"GPU node group: {created}; `invoke train --target eks` asks it for each job's nodes (at most "
        f"gpu_max_nodes = {most}; they join in 10 to 15 minutes); {back}"
    )


def confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise SpecError(f"{question} needs confirmation: run it in a terminal, or pass --yes")
    answer = input(f"{question} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise SpecError("stopped: nothing was changed")


def write_kubeconfig(outputs: dict, path: Path) -> Path:
    """A kubeconfig whose credentials come from `aws eks get-token` (no token stored in the file)."""
    name, region = outputs["cluster_name"], outputs["region"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": outputs["cluster_endpoint"],
                    "certificate-authority-data": outputs["cluster_certificate_authority_data"],
                },
            }
        ],
        "users": [
            {
                "name": name,
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": "aws",
                        "args": ["eks", "get-token", "--cluster-name", name, "--region", region, "--output", "json"],
                    }
                },
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    make_folder(path.parent)
    path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is valid YAML for kubectl
    path.chmod(0o600)
    return path


RUNNING_TRAINING = ("InProgress", "Stopping")
"""The SageMaker training job states that bill instances (DescribeTrainingJob's TrainingJobStatus)."""


def training_job_running(session, arn: str) -> bool:
    described = session.client("sagemaker").describe_training_job(TrainingJobName=arn.rsplit("/", 1)[1])
    return described["TrainingJobStatus"] in RUNNING_TRAINING


@dataclass
class BatchResources:
    """The stack's live AWS Batch resources, found by the stack's tag: job ARNs and ids are those not yet ended."""

    compute_environments: list[str]
    job_queues: list[str]
    job_definitions: list[str]
    jobs: dict[str, str]  # job id -> job ARN

    def arns(self) -> set[str]:
        return {*self.compute_environments, *self.job_queues, *self.job_definitions, *self.jobs.values()}


def batch_resources(session, stack_id: str) -> BatchResources:
    """Compute environments and job queues not deleted, ACTIVE job definitions (the Batch backend registers one per
    job shape, tagged like the rest; Terraform does not know them) and the jobs in the stack's queues not yet ended."""
    batch = session.client("batch")

    def listed(operation: str, key: str, **kwargs):
        for page in batch.get_paginator(operation).paginate(**kwargs):
            yield from page[key]

    def ours(item: dict) -> bool:
        return (item.get("tags") or {}).get(STACK_TAG) == stack_id and item.get("status") != "DELETED"

    environments = [
        ce["computeEnvironmentArn"] for ce in listed("describe_compute_environments", "computeEnvironments") if ours(ce)
    ]
    queues = [queue["jobQueueArn"] for queue in listed("describe_job_queues", "jobQueues") if ours(queue)]
    definitions = [
        definition["jobDefinitionArn"]
        for definition in listed("describe_job_definitions", "jobDefinitions", status="ACTIVE")
        if ours(definition)
    ]
    jobs = {
        job["jobId"]: job["jobArn"]
        for queue in queues
        for status in BATCH_ACTIVE
        for job in listed("list_jobs", "jobSummaryList", jobQueue=queue, jobStatus=status)
    }
    return BatchResources(environments, queues, definitions, jobs)


def release_batch(stack_id: str, region: str) -> list[str]:
    """Before the infra stack's destroy: terminate the stack's Batch jobs that have not ended (a multi-node job holds
    its instances, and their network interfaces in the stack's subnet, until it ends: Batch User Guide, "Compute
    environment considerations for MNP") and deregister its job definitions, which Terraform does not manage.
    Says what it did, one line each; what it could not do, the audit after the destroy lists."""
    session = boto3.session.Session(region_name=region)
    batch = session.client("batch")
    done: list[str] = []
    try:
        found = batch_resources(session, stack_id)
        for job_id, arn in found.jobs.items():
            batch.terminate_job(jobId=job_id, reason="make down PROFILE=aws: the stack is being destroyed")
            done.append(f"terminated the Batch job {arn}")
        for arn in found.job_definitions:
            batch.deregister_job_definition(jobDefinition=arn)
            done.append(f"deregistered the Batch job definition {arn}")
    except ClientError as error:
        code = error.response["Error"].get("Code")
        done.append(f"Batch jobs and job definitions not all released ({code}); the audit after the destroy lists them")
    return done


PLATFORM_VOLUME_TAG = ("trainkit:volume", "etcd")  # what the platform's etcd StorageClass tags its volume with
VOLUMES_WAIT_S = 300.0


def wait_for_platform_volumes(stack_id: str, region: str, timeout_s: float = VOLUMES_WAIT_S, poll_s: float = 5.0):
    """After the platform stack's destroy: its etcd volume goes with its claim, asynchronously (the StatefulSet's
    claim retention policy deletes the claim, then the EBS CSI driver, which runs in the cluster, deletes the
    volume: reclaimPolicy Delete). Wait for that before the infra stack takes the cluster and the driver away, which
    would leave the volume billed. Yields a line for what it waited for, or what is left and how to delete it."""
    ec2 = boto3.session.Session(region_name=region).client("ec2")
    key, value = PLATFORM_VOLUME_TAG
    filters = [{"Name": f"tag:{STACK_TAG}", "Values": [stack_id]}, {"Name": f"tag:{key}", "Values": [value]}]
    deadline, waited = time.monotonic() + timeout_s, False
    while True:
        left = [v["VolumeId"] for v in ec2.describe_volumes(Filters=filters)["Volumes"] if v["State"] != "deleted"]
        if not left:
            if waited:
                yield "the platform's etcd volume is deleted"
            return
        if time.monotonic() >= deadline:
            yield (
                f"the platform's etcd volume {', '.join(left)} is still there after {timeout_s:.0f} s (the EBS CSI "
                f"driver deletes it once its claim is gone); delete it yourself: aws ec2 delete-volume --region "
                f"{region} --volume-id {left[0]}"
            )
            return
        if not waited:
            yield f"waiting for the EBS CSI driver to delete the platform's etcd volume {', '.join(left)}"
            waited = True
        time.sleep(poll_s)


def network_interfaces(ec2, stack_id: str, vpc_ids: list[str]) -> set[str]:
    """The network interfaces tagged with the stack id (its nodes' launch templates tag theirs, EFA ones included), and
    every one left in the stack's VPCs whatever its tags: the VPC CNI leaks `available` interfaces that carry only its
    own tags, and an interface left in a subnet holds up the subnet's and the VPC's deletion. Named with their status
    and description (the CNI's say which node made them)."""
    searches = [[{"Name": f"tag:{STACK_TAG}", "Values": [stack_id]}]]
    if vpc_ids:
        searches.append([{"Name": "vpc-id", "Values": vpc_ids}])
    found = {}
    for filters in searches:
        for page in ec2.get_paginator("describe_network_interfaces").paginate(Filters=filters):
            for interface in page["NetworkInterfaces"]:
                about = f"{interface['Status']}, {interface.get('Description') or 'no description'}"
                found[interface["NetworkInterfaceId"]] = f"{interface['NetworkInterfaceId']} ({about})"
    return set(found.values())


def audit(stack_id: str, region: str, name: str) -> list[str]:
    """Everything still tagged with this stack id (or named after it), by ARN or id, and every network interface left
    in the stack's VPC."""
    session = boto3.session.Session(region_name=region)
    left: set[str] = set()
    tagging = session.client("resourcegroupstaggingapi")
    for page in tagging.get_paginator("get_resources").paginate(TagFilters=[{"Key": STACK_TAG, "Values": [stack_id]}]):
        left.update(item["ResourceARN"] for item in page["ResourceTagMappingList"])
    try:
        batch = batch_resources(session, stack_id).arns()
    except ClientError as error:  # say so instead of claiming it is clean
        batch = {f"Batch not audited: {error.response['Error'].get('Code')}"}
    ec2 = session.client("ec2")
    kms = session.client("kms")
    for arn in list(left):
        # The tagging API still lists resources that are gone but not yet forgotten; they cost nothing.
        if ":kms:" in arn and kms.describe_key(KeyId=arn)["KeyMetadata"]["KeyState"] == "PendingDeletion":
            left.discard(arn)  # a key scheduled for deletion is not billed
        elif ":training-job/" in arn and not training_job_running(session, arn):
            left.discard(arn)  # an ended SageMaker job stays listed for good and bills nothing
        elif ":batch:" in arn:
            left.discard(arn)  # Batch's own listing says what is live: ended jobs, old job definitions stay listed
        elif ":network-interface/" in arn:
            left.discard(arn)  # the EC2 listing below names each one left, by id
        elif ":natgateway/" in arn:
            gateways = ec2.describe_nat_gateways(NatGatewayIds=[arn.rsplit("/", 1)[1]])["NatGateways"]
            if all(g["State"] in ("deleted", "deleting") for g in gateways):
                left.discard(arn)
    left |= batch
    tag_filter = [{"Name": f"tag:{STACK_TAG}", "Values": [stack_id]}]
    vpcs = [vpc["VpcId"] for vpc in ec2.describe_vpcs(Filters=tag_filter)["Vpcs"]]
    left.update(vpcs)
    left |= network_interfaces(ec2, stack_id, vpcs)
    for reservation in ec2.describe_instances(Filters=tag_filter)["Reservations"]:
        left.update(i["InstanceId"] for i in reservation["Instances"] if i["State"]["Name"] != "terminated")
    for volume in ec2.describe_volumes(Filters=tag_filter)["Volumes"]:
        left.add(volume["VolumeId"])
    for address in ec2.describe_addresses(Filters=tag_filter)["Addresses"]:
        left.add(address["AllocationId"])
    for gateway in ec2.describe_nat_gateways(Filters=tag_filter)["NatGateways"]:
        if gateway["State"] not in ("deleted", "deleting"):
            left.add(gateway["NatGatewayId"])
    eks = session.client("eks")
    if name in eks.list_clusters()["clusters"]:
        left.add(f"eks cluster {name}")
    ecr = session.client("ecr")
    for repo in ecr.describe_repositories()["repositories"]:
        if repo["repositoryName"].startswith(f"{name}/"):
            left.add(repo["repositoryArn"])
    try:
        for fs in session.client("fsx").describe_file_systems()["FileSystems"]:
            tags = {t["Key"]: t["Value"] for t in fs.get("Tags", [])}
            if tags.get(STACK_TAG) == stack_id and fs["Lifecycle"] != "DELETING":
                left.add(fs["FileSystemId"])
    except ClientError as error:  # some emulators lack FSx: say so instead of claiming it is clean
        left.add(f"FSx not audited: {error.response['Error'].get('Code')}")
    return sorted(left)
