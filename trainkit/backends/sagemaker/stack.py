"""What the SageMaker part of the infra stack gives a job: the execution role, the runs bucket, the VPC settings
that let a job's instances reach each other, and the Hugging Face token's secret, from the `sagemaker` output that
`make up PROFILE=aws` records. Without that record (a dry run on a laptop) placeholders stand in, and say so; a
submission needs the real ones."""

from __future__ import annotations

from dataclasses import dataclass

from trainkit.infra.outputs import InfraOutputs


@dataclass(frozen=True)
class SageMakerStack:
    role_arn: str
    bucket: str
    subnets: tuple[str, ...]
    security_group_ids: tuple[str, ...]
    hf_token_secret_arn: str | None
    recorded: bool
    stack_id: str | None = None  # tags the jobs, so `infra.audit` finds one still running
    data_buckets: tuple[str, ...] = ()  # the role reads datasets from these besides the runs bucket
    kms_key_arn: str | None = None
    """The stack's KMS key, which encrypts each job's output and, where the instance type has no local storage, its
    volume (request.py); None for outputs recorded before the stack exported it (the bucket's default encryption,
    with the same key, still applies to the output)."""
    inter_container_traffic_encryption: bool = False
    """EnableInterContainerTrafficEncryption for every job: the stack's choice (sagemaker_inter_container_traffic_
    encryption, off by default, terraform/modules/sagemaker says why)."""
    mlflow_token_secret_arn: str | None = None
    """The secret of a self-hosted MLflow server's token (`invoke secrets.mlflow-token`); None for outputs recorded
    before the stack made it."""

    def secret_arn(self, credential) -> str | None:
        """The stack's Secrets Manager secret of a credential (trainkit/run/secrets.py), None: the stack has none."""
        return getattr(self, credential.stack_key)


PLACEHOLDER = SageMakerStack(
    role_arn="arn:aws:iam::000000000000:role/trainkit-sagemaker",
    bucket="trainkit-runs-000000000000",
    subnets=("subnet-00000000000000000",),
    security_group_ids=("sg-00000000000000000",),
    hf_token_secret_arn="arn:aws:secretsmanager:us-east-1:000000000000:secret:trainkit-hf-token",
    mlflow_token_secret_arn="arn:aws:secretsmanager:us-east-1:000000000000:secret:trainkit-mlflow-token",
    recorded=False,
    kms_key_arn="arn:aws:kms:us-east-1:000000000000:key/00000000-0000-0000-0000-000000000000",
)
NOT_RECORDED = (
    "no SageMaker stack recorded (`make up PROFILE=aws` with sagemaker_enabled = true records it): the role, "
    "bucket, subnets, security group, secret and KMS key in this request are placeholders"
)


def load_stack(infra: InfraOutputs) -> SageMakerStack:
    data = infra.sagemaker
    if not data:
        return PLACEHOLDER
    return SageMakerStack(
        role_arn=data["role_arn"],
        bucket=data["bucket"],
        subnets=tuple(data["subnet_ids"]),
        security_group_ids=tuple(data["security_group_ids"]),
        hf_token_secret_arn=data.get("hf_token_secret_arn"),
        mlflow_token_secret_arn=data.get("mlflow_token_secret_arn"),
        recorded=True,
        stack_id=infra.stack_id,
        data_buckets=infra.data_buckets,  # the infra stack's data_source_buckets, which the role may read
        kms_key_arn=data.get("kms_key_arn"),
        inter_container_traffic_encryption=bool(data.get("inter_container_traffic_encryption", False)),
    )
