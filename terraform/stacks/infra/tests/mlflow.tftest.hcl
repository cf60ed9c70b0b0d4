# SageMaker managed MLflow (mlflow_enabled), with mocked AWS: the tracking server `--track mlflow` logs to on AWS,
# and the job roles that may log to it.

mock_provider "aws" {
  source = "../../tests/mocks"
}

override_resource {
  target = module.mlflow.aws_sagemaker_mlflow_tracking_server.this[0]
  values = { arn = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/trainkit-mlflow", tracking_server_url = "https://t-abc123.us-east-1.experiments.sagemaker.aws" }
}

variables {
  region                = "us-east-1"
  availability_zones    = ["us-east-1a", "us-east-1b", "us-east-1c"]
  gpu_availability_zone = "us-east-1b"
  owner                 = "ci@example.com"
  public_access_cidrs   = ["203.0.113.0/24"]
  stack_id              = "trainkit-test"
}

run "no_tracking_server_unless_asked" {
  command = plan

  variables {
    sagemaker_enabled = true
  }

  assert {
    condition     = output.mlflow == null && module.mlflow.server == null && module.sagemaker.mlflow_policy == null && module.eks.training_identity == null
    error_message = "Without mlflow_enabled there is no tracking server and the job roles get no MLflow grant."
  }
}

run "a_small_tracking_server_with_its_own_bucket_and_role_which_the_job_roles_may_log_to" {
  command = apply

  variables {
    mlflow_enabled    = true
    sagemaker_enabled = true
    batch_enabled     = true
  }

  assert {
    condition     = output.mlflow.tracking_server_arn == "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/trainkit-mlflow" && output.mlflow.artifact_bucket == "trainkit-mlflow-123456789012"
    error_message = "The launcher gets the server's ARN (a tracked job's default --tracking-uri on AWS) and its artifact bucket."
  }
  assert {
    condition     = jsonencode(module.mlflow.server) == jsonencode({ name = "trainkit-mlflow", artifact_store_uri = "s3://trainkit-mlflow-123456789012/", size = "Small", automatic_model_registration = false })
    error_message = "A Small server named for the stack stores its artifacts in its own bucket and registers no models."
  }
  assert {
    condition     = jsonencode(module.mlflow.server_trust) == jsonencode(["sagemaker.amazonaws.com"])
    error_message = "The server's role is SageMaker's."
  }
  # Service Authorization Reference, "Actions defined by Amazon SageMaker with MLflow": each action trainkit's client
  # calls takes the mlflow-tracking-server resource, arn:${Partition}:sagemaker:${Region}:${Account}:mlflow-tracking-server/${Name}.
  assert {
    condition = alltrue([
      jsonencode(module.mlflow.client_grants.LogToTheTrackingServer.resources) == jsonencode([output.mlflow.tracking_server_arn]),
      alltrue([for action in module.mlflow.client_grants.LogToTheTrackingServer.actions : startswith(action, "sagemaker-mlflow:")]),
      contains(module.mlflow.client_grants.LogToTheTrackingServer.actions, "sagemaker-mlflow:LogBatch"),
      contains(module.mlflow.client_grants.LogToTheTrackingServer.actions, "sagemaker-mlflow:SearchRuns"),
      contains(module.mlflow.client_grants.LogToTheTrackingServer.actions, "sagemaker-mlflow:GetMetricHistory"),
      jsonencode(module.mlflow.client_grants.WriteArtifacts.resources) == jsonencode(["arn:aws:s3:::trainkit-mlflow-123456789012", "arn:aws:s3:::trainkit-mlflow-123456789012/*"]),
    ])
    error_message = "A job's role logs to this server only and writes artifacts to its bucket only."
  }
  assert {
    condition     = module.sagemaker.mlflow_policy == module.mlflow.client_policy_json && module.batch.mlflow_policy == module.mlflow.client_policy_json
    error_message = "The SageMaker execution role and the Batch job role (the containers' credentials) may log to the server."
  }
  assert {
    condition     = jsonencode(module.eks.training_identity) == jsonencode({ namespace = "trainkit-jobs", service_account = "trainkit-training", policy = module.mlflow.client_policy_json })
    error_message = "The EKS training pods' service account gets, through Pod Identity, a role that may log to the server."
  }
}
