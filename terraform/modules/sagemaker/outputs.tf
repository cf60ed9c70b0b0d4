################################################################################
# SageMaker Training
################################################################################

output "sagemaker" {
  description = "What trainkit's SageMaker backend reads (trainkit/backends/sagemaker/stack.py); null when not created."
  value = var.create ? {
    role_arn                = aws_iam_role.training[0].arn
    bucket                  = aws_s3_bucket.runs[0].bucket
    subnet_ids              = var.subnet_ids
    security_group_ids      = [aws_security_group.training[0].id]
    hf_token_secret_arn     = var.hf_token_secret_arn
    mlflow_token_secret_arn = var.mlflow_token_secret_arn
    # The launcher encrypts each job's output (OutputDataConfig.KmsKeyId) and, where the instance type has no local
    # storage, its volume (ResourceConfig.VolumeKmsKeyId) with the stack's key.
    kms_key_arn                        = var.kms_key_arn
    inter_container_traffic_encryption = var.inter_container_traffic_encryption
  } : null
}

# What the stack's tests check (terraform/stacks/infra/tests): the settings as configured.

output "public_access_blocked" {
  description = "Whether every public-access switch of the runs bucket is on."
  value = var.create ? alltrue([
    for key in ["block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets"] :
    aws_s3_bucket_public_access_block.runs[0][key]
  ]) : null
}

output "encryption" {
  description = "The runs bucket's default encryption."
  value = var.create ? one([
    for rule in aws_s3_bucket_server_side_encryption_configuration.runs[0].rule :
    one(rule.apply_server_side_encryption_by_default)
  ]) : null
}

output "tls_only" {
  description = "The bucket policy's statement on plain HTTP."
  value = {
    effect = one(data.aws_iam_policy_document.tls_only.statement).effect
    values = one(one(data.aws_iam_policy_document.tls_only.statement).condition).values
  }
}

output "checkpoint_expiry" {
  description = "The lifecycle rule that expires old checkpoints."
  value = var.create ? one([
    for rule in aws_s3_bucket_lifecycle_configuration.runs[0].rule :
    { prefix = one(rule.filter).prefix, days = one(rule.expiration).days } if rule.id == "expire-old-checkpoints"
  ]) : null
}

output "self_traffic" {
  description = "The security group and the groups its all-traffic rules admit."
  value = var.create ? {
    group   = aws_security_group.training[0].id
    ingress = aws_vpc_security_group_ingress_rule.training_self[0].referenced_security_group_id
    egress  = aws_vpc_security_group_egress_rule.training_self[0].referenced_security_group_id
  } : null
}

output "trust" {
  description = "Who may assume the execution role."
  value = {
    service        = tolist(one(one(data.aws_iam_policy_document.trust.statement).principals).identifiers)
    source_account = tolist(one(one(data.aws_iam_policy_document.trust.statement).condition).values)
  }
}

output "grants" {
  description = "The execution role's resources by statement, sorted."
  value       = { for statement in data.aws_iam_policy_document.training.statement : statement.sid => sort(statement.resources) }
}

output "grant_conditions" {
  description = "The execution role's conditions by statement: variable => [test, sorted values]."
  value = { for statement in data.aws_iam_policy_document.training.statement : statement.sid => {
    for condition in coalesce(statement.condition, []) : condition.variable => [condition.test, sort(condition.values)]
  } }
}

output "grant_actions" {
  description = "The execution role's actions by statement, sorted."
  value       = { for statement in data.aws_iam_policy_document.training.statement : statement.sid => sort(statement.actions) }
}

output "mlflow_policy" {
  description = "The MLflow client policy attached to the execution role; null when the role has none."
  value       = var.create && var.mlflow_enabled ? aws_iam_role_policy.mlflow[0].policy : null
}
