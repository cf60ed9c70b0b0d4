################################################################################
# SageMaker Training: what a `--target sagemaker` job needs from the account
################################################################################

variable "create" {
  description = "Create the SageMaker part (role, runs bucket, security group). false creates nothing."
  type        = bool
  default     = false
  nullable    = false
}

variable "name" {
  description = "Name prefix of the stack's resources."
  type        = string
}

variable "vpc_id" {
  description = "VPC the training instances join (VpcConfig)."
  type        = string
}

variable "subnet_ids" {
  description = "Subnets of the training instances (VpcConfig.Subnets): private, with a route to S3 and ECR."
  type        = list(string)
}

variable "kms_key_arn" {
  description = "The stack's KMS key: the bucket and the role's decrypts (the bucket's objects, the tokens' secrets)."
  type        = string
}

variable "image_repository_arns" {
  description = "ECR repositories the role may pull training images from (this stack's)."
  type        = list(string)
}

variable "hf_token_secret_arn" {
  description = "The Hugging Face token's Secrets Manager secret (the infra stack's, shared with AWS Batch), which the execution role may read; null: no token."
  type        = string
  default     = null
}

variable "mlflow_token_secret_arn" {
  description = "The Secrets Manager secret of a self-hosted MLflow tracking server's bearer token (MLFLOW_TRACKING_TOKEN; the infra stack's, shared with AWS Batch), which the execution role may read; null: no token. A SageMaker managed tracking server needs none."
  type        = string
  default     = null
}

variable "data_source_buckets" {
  description = "Buckets the jobs may read datasets from (read only), besides the runs bucket."
  type        = list(string)
  default     = []
}

variable "checkpoint_retention_days" {
  description = "Days after which checkpoint objects (checkpoints/ in the runs bucket) expire; a run resumed later than that starts over."
  type        = number
  default     = 30

  validation {
    condition     = var.checkpoint_retention_days >= 1
    error_message = "checkpoint_retention_days must be at least 1."
  }
}

variable "inter_container_traffic_encryption" {
  description = "Encrypt the traffic between a job's instances (CreateTrainingJob EnableInterContainerTrafficEncryption), which the launcher sets from the `sagemaker` output. Off by default: SageMaker says training may take longer, depending on how much the instances communicate (Developer Guide, \"Protect Communications Between ML Compute Instances in a Distributed Training Job\"), and data-parallel training communicates at every step."
  type        = bool
  default     = false
  nullable    = false
}

variable "force_destroy" {
  description = "Let `make down` delete the runs bucket with its objects (runs, checkpoints, models): back to nothing."
  type        = bool
  default     = true
}

variable "mlflow_enabled" {
  description = "Let this module's job role log to the stack's SageMaker managed MLflow tracking server (mlflow_client_policy_json)."
  type        = bool
  default     = false
  nullable    = false
}

variable "mlflow_client_policy_json" {
  description = "The mlflow module's client policy: what the job role needs to log to the tracking server and write its artifacts."
  type        = string
  default     = null
}
