################################################################################
# SageMaker managed MLflow: the stack's experiment tracking server
################################################################################

variable "create" {
  description = "Create the tracking server, its artifact bucket and role. false creates nothing."
  type        = bool
  default     = false
  nullable    = false
}

variable "name" {
  description = "Name prefix of the stack's resources; the tracking server is <name>-mlflow."
  type        = string
}

variable "kms_key_arn" {
  description = "The stack's KMS key: the artifact bucket's default encryption."
  type        = string
}

variable "tracking_server_size" {
  description = "The tracking server's size: Small, Medium or Large (SageMaker's TrackingServerSize; Small is AWS's suggestion for a team of up to 25 users)."
  type        = string
  default     = "Small"
  nullable    = false

  validation {
    condition     = contains(["Small", "Medium", "Large"], var.tracking_server_size)
    error_message = "tracking_server_size: one of Small, Medium, Large."
  }
}

variable "mlflow_version" {
  description = "The server's MLflow version, major.minor (the provider keeps only those): 3.0 serves the MLflow 3 client trainkit's workers run (an MLflow client and server of one major version work together)."
  type        = string
  default     = "3.0"
  nullable    = false

  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+$", var.mlflow_version))
    error_message = "mlflow_version: major.minor, e.g. 3.0."
  }
}

variable "force_destroy" {
  description = "Let `make down` delete the artifact bucket with the runs' artifacts in it: back to nothing."
  type        = bool
  default     = true
  nullable    = false
}
