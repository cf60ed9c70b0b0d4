"""What the Batch part of the infra stack gives a job: the job queue and its compute environment, the job and
execution roles, the instance types the compute environment launches, where FSx for Lustre is mounted, the log
group, the Hugging Face token's secret and the most nodes a job may have, from the `batch` output that `make up
PROFILE=aws` records (terraform/modules/batch). Without that record (a dry run on a laptop) placeholders stand in,
and say so; a submission needs the real ones."""

from __future__ import annotations

from dataclasses import dataclass

from trainkit.infra.outputs import InfraOutputs


@dataclass(frozen=True)
class BatchStack:
    job_queue_arn: str
    job_queue_name: str
    compute_environment_arn: str
    job_role_arn: str
    execution_role_arn: str
    instance_types: tuple[str, ...]
    fsx_mount_path: str
    log_group: str
    hf_token_secret_arn: str | None
    max_nodes: int | None
    recorded: bool
    stack_id: str | None = None  # tags the jobs, so `infra.audit` finds one still running
    mlflow_token_secret_arn: str | None = None
    """The secret of a self-hosted MLflow server's token (`invoke secrets.mlflow-token`); None for outputs recorded
    before the stack made it."""

    def secret_arn(self, credential) -> str | None:
        """The stack's Secrets Manager secret of a credential (trainkit/run/secrets.py), None: the stack has none."""
        return getattr(self, credential.stack_key)


PLACEHOLDER = BatchStack(
    job_queue_arn="arn:aws:batch:us-east-1:000000000000:job-queue/trainkit-batch",
    job_queue_name="trainkit-batch",
    compute_environment_arn="arn:aws:batch:us-east-1:000000000000:compute-environment/trainkit-batch",
    job_role_arn="arn:aws:iam::000000000000:role/trainkit-batch-job",
    execution_role_arn="arn:aws:iam::000000000000:role/trainkit-batch-execution",
    instance_types=(),
    fsx_mount_path="/fsx",
    log_group="/aws/batch/job",
    hf_token_secret_arn="arn:aws:secretsmanager:us-east-1:000000000000:secret:trainkit-hf-token",
    mlflow_token_secret_arn="arn:aws:secretsmanager:us-east-1:000000000000:secret:trainkit-mlflow-token",
    max_nodes=None,
    recorded=False,
)
NOT_RECORDED = (
    "no Batch stack recorded (`make up PROFILE=aws` with batch_enabled = true records it): the job queue, roles "
    "and secret in these requests are placeholders"
)


def load_stack(infra: InfraOutputs) -> BatchStack:
    data = infra.batch  # None: not recorded, or the stack's Batch part is off
    if not data:
        return PLACEHOLDER
    return BatchStack(
        job_queue_arn=data["job_queue_arn"],
        job_queue_name=data["job_queue_name"],
        compute_environment_arn=data["compute_environment_arn"],
        job_role_arn=data["job_role_arn"],
        execution_role_arn=data["execution_role_arn"],
        instance_types=tuple(data.get("instance_types") or ()),
        fsx_mount_path=data.get("fsx_mount_path") or PLACEHOLDER.fsx_mount_path,
        log_group=data.get("log_group") or PLACEHOLDER.log_group,
        hf_token_secret_arn=data.get("hf_token_secret_arn"),
        mlflow_token_secret_arn=data.get("mlflow_token_secret_arn"),
        max_nodes=data.get("max_nodes"),
        recorded=True,
        stack_id=infra.stack_id,
    )
