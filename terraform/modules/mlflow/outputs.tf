################################################################################
# SageMaker managed MLflow
################################################################################

output "mlflow" {
  description = "What trainkit's AWS backends read: the tracking server's ARN (the default --tracking-uri of a tracked job), its UI's URL and the artifact bucket; null when not created."
  value = var.create ? {
    tracking_server_arn = aws_sagemaker_mlflow_tracking_server.this[0].arn
    tracking_server_url = aws_sagemaker_mlflow_tracking_server.this[0].tracking_server_url
    artifact_bucket     = aws_s3_bucket.artifacts[0].bucket
  } : null
}

output "client_policy_json" {
  description = "The policy a job's role needs to log to the server (the SageMaker execution role's and the Batch job role's)."
  value       = data.aws_iam_policy_document.client.json
}

# What the stack's tests check (terraform/stacks/infra/tests): the settings as configured.

output "server" {
  description = "The tracking server as configured; null when not created."
  value = var.create ? {
    name                         = aws_sagemaker_mlflow_tracking_server.this[0].tracking_server_name
    artifact_store_uri           = aws_sagemaker_mlflow_tracking_server.this[0].artifact_store_uri
    size                         = aws_sagemaker_mlflow_tracking_server.this[0].tracking_server_size
    automatic_model_registration = aws_sagemaker_mlflow_tracking_server.this[0].automatic_model_registration
  } : null
}

output "server_trust" {
  description = "Who may assume the server's role."
  value       = tolist(one(one(data.aws_iam_policy_document.server_trust.statement).principals).identifiers)
}

output "client_grants" {
  description = "The client policy: sid => {actions, resources}, sorted."
  value = { for statement in concat(data.aws_iam_policy_document.client.statement, data.aws_iam_policy_document.artifacts_key["ArtifactsKey"].statement) : statement.sid => {
    actions   = sort(statement.actions)
    resources = sort(statement.resources)
  } }
}
