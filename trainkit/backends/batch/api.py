"""The Batch backend's calls to AWS up to a submission: the preflight, the job definition of the job's shape, SubmitJob,
and this machine's record of what it submitted.

Preflight, in one pass so the user sees every problem at once, before anything is registered or submitted (the
AWS Batch User Guide page of each rule in brackets):
- the job queue exists, is ENABLED and VALID, and one of its compute environments can run the job: MANAGED ("MNP jobs
  aren't supported on UNMANAGED compute environments"), on EC2 on-demand instances ("aren't supported on compute
  environments that use Spot Instances"; not Fargate) ["Compute environment considerations for MNP"], ENABLED and
  VALID, launching the instance type, with maxvCpus covering nodes x the instance's vCPUs (a job that needs more
  than its environment may launch waits RUNNABLE for ever);
- the job and execution roles exist (IAM GetRole);
- the image is in this stack's ECR and holds trainkit (trainkit/backends/eks/image.py, as for EKS pods);
- the account's EC2 quota of the instance family covers nodes x vCPUs: for P instances "Running On-Demand P
  instances" (L-417A185B, counted in vCPUs; Service Quotas: the applied value, else the default);
- --nodes is at most the stack's max_nodes, and the stack's compute environment launches --instance-type;
- no job of the same run is still active (two attempts would write one run folder);
- --init pretrained: the token's secret holds a value (DescribeSecret; the value itself is never read here). A job
  definition names the secret only when it holds one: ECS cannot start a container whose secret has no value.

Which job is a run's: job names are `<run id as a name>-<UTC stamp>` (request.job_name), and each submission's id
is also kept in the state folder (`.trainkit/batch/<run id>.json`), so `invoke status --run-id` finds a Batch run
without `--target`.
"""

from __future__ import annotations

from training.spec import Job
from trainkit.backends.aws import Clients, Submissions, error_code, of_run, secret_state
from trainkit.backends.batch import request
from trainkit.backends.batch.stack import BatchStack
from trainkit.infra.outputs import BATCH_ACTIVE
from trainkit.job.models import downloads_weights
from trainkit.run.workload import Workload

ON_DEMAND_QUOTAS = {"p": ("L-417A185B", "Running On-Demand P instances")}
"""EC2's vCPU quota of each instance family the table holds (Service Quotas, service code ec2)."""
ENABLED = "batch_enabled = true"
STORE = "`invoke secrets.hf-token --target batch` stores it (from a prompt or a file, never a flag)"


SUBMITTED = Submissions("batch")
"""Each submission's job id and name, by run (`.trainkit/batch/<run id>.json`)."""


# --- preflight ---------------------------------------------------------------------------------------------------


def preflight(clients: Clients, job: Job, workload: Workload, stack: BatchStack) -> list[str]:
    """Every reason the job cannot be submitted, each saying what to change (empty: go)."""
    from trainkit.backends.eks.image import image_problems

    problems = stack_problems(job, stack) + queue_problems(clients, job, stack) + role_problems(clients, stack)
    problems += image_problems(job, clients("ecr"))
    problems += quota_problems(clients, job)
    needs_token = job.run.workload == "recipe" and downloads_weights(job)
    if needs_token and secret_state(clients, stack.hf_token_secret_arn) != "value":
        problems.append(f"--init pretrained needs the Hugging Face token in {stack.hf_token_secret_arn}; {STORE}")
    active = active_jobs(clients, stack, job.run.run_id)
    if active:
        problems.append(
            f"run {job.run.run_id} is still {active[0]['status']} as Batch job {active[0]['jobName']} (two attempts "
            f"would write one run folder): wait for it, or `invoke stop --run-id {job.run.run_id}`"
        )
    return problems


def stack_problems(job: Job, stack: BatchStack) -> list[str]:
    """What the stack's record alone refuses (no AWS call)."""
    problems, instance, nodes = [], str(job.placement.instance_type), job.parallelism.nodes
    if stack.max_nodes is not None and nodes > stack.max_nodes:
        problems.append(
            f"--nodes {nodes}: the stack's Batch compute environment launches at most {stack.max_nodes} nodes; lower "
            "--nodes, or raise batch_max_nodes in terraform/stacks/infra/terraform.tfvars and `make up PROFILE=aws`"
        )
    if stack.instance_types and not launches(stack.instance_types, instance):
        problems.append(
            f"--instance-type {instance}: the stack's Batch compute environment launches "
            f"{', '.join(stack.instance_types)}; give one of them, or change the stack's instance types and `make up "
            "PROFILE=aws`"
        )
    return problems


def launches(types, instance: str) -> bool:
    """Whether a compute environment's instanceTypes (types or families: `p5`) include the instance type."""
    return instance in types or instance.split(".")[0] in types


def queue_problems(clients: Clients, job: Job, stack: BatchStack) -> list[str]:
    batch = clients("batch")
    queues = batch.describe_job_queues(jobQueues=[stack.job_queue_arn]).get("jobQueues", [])
    if not queues:
        return [f"job queue {stack.job_queue_name} does not exist; `make up PROFILE=aws` with {ENABLED} makes it"]
    queue = queues[0]
    if (queue.get("state"), queue.get("status")) != ("ENABLED", "VALID"):
        return [
            f"job queue {stack.job_queue_name} is {queue.get('state')} / {queue.get('status')} "
            f"({queue.get('statusReason', 'no reason given')}): enable it, or `make up PROFILE=aws` to repair it"
        ]
    arns = [entry["computeEnvironment"] for entry in queue.get("computeEnvironmentOrder", [])]
    found = batch.describe_compute_environments(computeEnvironments=arns).get("computeEnvironments", []) if arns else []
    reasons = {env.get("computeEnvironmentName", "?"): environment_problem(env, job) for env in found}
    if any(reason is None for reason in reasons.values()):
        return []
    listed = "; ".join(f"{name}: {reason}" for name, reason in reasons.items()) or "it has none"
    return [f"no compute environment of job queue {stack.job_queue_name} can run this job ({listed})"]


def environment_problem(env: dict, job: Job) -> str | None:
    """Why a compute environment cannot run the job (None: it can)."""
    resources, instance = env.get("computeResources") or {}, str(job.placement.instance_type)
    vcpus = request.instance_host(instance)[0] * job.parallelism.nodes
    if env.get("type") != "MANAGED":
        return "UNMANAGED: Batch runs multi-node parallel jobs on MANAGED compute environments only"
    if resources.get("type") != "EC2":
        return f"{resources.get('type')} capacity: multi-node parallel jobs need EC2 on-demand instances"
    if (env.get("state"), env.get("status")) != ("ENABLED", "VALID"):
        return f"{env.get('state')} / {env.get('status')} ({env.get('statusReason', 'no reason given')})"
    if not launches(resources.get("instanceTypes") or (), instance):
        return f"launches {', '.join(resources.get('instanceTypes') or ())}, not {instance}"
    if resources.get("maxvCpus", 0) < vcpus:
        return (
            f"maxvCpus {resources.get('maxvCpus')} is below the job's {vcpus} ({job.parallelism.nodes} x {instance}); "
            "raise batch_max_nodes in terraform/stacks/infra/terraform.tfvars or lower --nodes"
        )
    return None


def role_problems(clients: Clients, stack: BatchStack) -> list[str]:
    from botocore.exceptions import ClientError

    problems = []
    for what, arn in (("job role", stack.job_role_arn), ("execution role", stack.execution_role_arn)):
        try:
            clients("iam").get_role(RoleName=arn.rsplit("/", 1)[-1])
        except ClientError as error:
            problems.append(f"{what} {arn}: {error_code(error)}; `make up PROFILE=aws` with {ENABLED} makes it")
    return problems


def quota_value(clients: Clients, code: str) -> float | None:
    """The account's value of an EC2 quota: the applied one, else its default (a quota nobody changed may have none
    applied); None: no such quota in this region."""
    client = clients("service-quotas")
    try:
        return client.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
    except client.exceptions.NoSuchResourceException:
        pages = client.get_paginator("list_aws_default_service_quotas").paginate(ServiceCode="ec2")
        found = [q for page in pages for q in page.get("Quotas", []) if q.get("QuotaCode") == code]
        return found[0].get("Value") if found else None


def quota_problems(clients: Clients, job: Job) -> list[str]:
    instance = str(job.placement.instance_type)
    code, name = ON_DEMAND_QUOTAS[instance[0]]
    needed = request.instance_host(instance)[0] * job.parallelism.nodes
    value = quota_value(clients, code)
    if value is None:
        return [f"no EC2 quota {name!r} ({code}) in this region: is {instance} offered here?"]
    if value < needed:
        return [
            f"the account's EC2 quota {name!r} ({code}) is {value:g} vCPUs and {job.parallelism.nodes} x {instance} "
            f"need {needed}: request an increase in the Service Quotas console (Amazon EC2), or lower --nodes"
        ]
    return []


def run_jobs(clients: Clients, stack: BatchStack, run_id: str) -> list[dict]:
    """The run's jobs in the queue, newest first (ListJobs by the name prefix: jobStatus is then ignored and jobs
    of every status are listed, newest first)."""
    prefix = request.job_name(run_id, "")[:-1]
    pages = (
        clients("batch")
        .get_paginator("list_jobs")
        .paginate(jobQueue=stack.job_queue_arn, filters=[{"name": "JOB_NAME", "values": [f"{prefix}-*"]}])
    )
    found = [job for page in pages for job in page.get("jobSummaryList", []) if of_run(job["jobName"], prefix)]
    return sorted(found, key=lambda job: job.get("createdAt", 0), reverse=True)


def active_jobs(clients: Clients, stack: BatchStack, run_id: str) -> list[dict]:
    return [job for job in run_jobs(clients, stack, run_id) if job.get("status") in BATCH_ACTIVE]


# --- submit ------------------------------------------------------------------------------------------------------


def definition(clients: Clients, body: dict) -> str:
    """`name:revision` of an ACTIVE job definition of the shape, registered if there is none (the name carries a
    hash of the content, so any ACTIVE revision of it is this shape)."""
    batch, name = clients("batch"), body["jobDefinitionName"]
    found = batch.describe_job_definitions(jobDefinitionName=name, status="ACTIVE").get("jobDefinitions", [])
    if found:
        return f"{name}:{max(d['revision'] for d in found)}"
    return f"{name}:{batch.register_job_definition(**body)['revision']}"


def keep_image(clients: Clients, job: Job) -> None:
    """Tag the image run-<run id> (the repository's lifecycle rule keeps it while the run may resume on it)."""
    from trainkit.backends.eks.image import check_image

    check_image(job, clients("ecr"))  # its note, if any, the preflight printed


def submit(clients: Clients, body: dict) -> str:
    return clients("batch").submit_job(**body)["jobId"]
