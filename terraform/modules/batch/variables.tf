################################################################################
# AWS Batch: what a `--target batch` multi-node parallel job needs from the account
################################################################################

variable "create" {
  description = "Create the Batch part (compute environment, job queue, launch template, placement group, roles, security group). false creates nothing (outputs are null)."
  type        = bool
  default     = false
  nullable    = false
}

variable "name" {
  description = "Name prefix of the stack's resources (the job queue is <name>-batch)."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the instances' security group."
  type        = string
}

variable "subnet_id" {
  description = "The single subnet of the instances: the GPU subnet, in the AZ of the GPU capacity and of FSx for Lustre."
  type        = string
}

################################################################################
# Instances
################################################################################

variable "instance_types" {
  description = <<-EOT
    EC2 instance types of the compute environment, each with its vCPUs and its EFA interfaces card by card (the
    gpu-nodegroup module's instance_types[type].vcpus and efa_interfaces[type]). One launch template serves them
    all, so they must share one EFA layout: p5.48xlarge with p5e.48xlarge, p4d.24xlarge with p4de.24xlarge,
    p5en.48xlarge alone. The first one sizes max vCPUs (max_nodes of it).
  EOT
  type = list(object({
    name  = string
    vcpus = number
    network_interfaces = list(object({
      network_card_index = number
      device_index       = number
      interface_type     = string
    }))
  }))

  validation {
    condition     = length(var.instance_types) > 0
    error_message = "instance_types needs at least one instance type, e.g. p5.48xlarge."
  }
  validation {
    condition     = length(distinct([for type in var.instance_types : type.network_interfaces])) <= 1
    error_message = "instance_types must share one EFA layout (one launch template serves them all): p5.48xlarge with p5e.48xlarge, or p4d.24xlarge with p4de.24xlarge; p5en.48xlarge (16 interfaces) alone."
  }
}

variable "max_nodes" {
  description = "Most instances of the first instance type running at once (max vCPUs = max_nodes x its vCPUs); what one multi-node job may span. Min vCPUs is 0: nothing runs, nothing bills, between jobs."
  type        = number
  default     = 2
  nullable    = false

  validation {
    condition     = var.max_nodes >= 1 && floor(var.max_nodes) == var.max_nodes
    error_message = "max_nodes must be a whole number of at least 1."
  }
}

variable "root_volume_gb" {
  description = "Root volume of each instance in GiB (gp3, encrypted): it holds the training image's layers."
  type        = number
  default     = 500
  nullable    = false

  validation {
    condition     = var.root_volume_gb >= 100
    error_message = "root_volume_gb must be at least 100 GiB: CUDA training images are tens of GiB."
  }
}

variable "ami_id" {
  description = "AMI of the instances; null: the latest Amazon ECS-optimized Amazon Linux 2023 GPU AMI AWS Batch picks (image type ECS_AL2023_NVIDIA). Set it to an ECS GPU AMI with the EFA installer's software if that one lacks it."
  type        = string
  default     = null
}

variable "enable_placement_group" {
  description = "Launch the instances into a cluster placement group (off only for emulators that lack the API)."
  type        = bool
  default     = true
  nullable    = false
}

variable "capacity_wait_minutes" {
  description = "Minutes a job may wait in RUNNABLE for GPU capacity before the queue cancels it (10 to 1440): a multi-node job half-provisioned bills the instances it already has."
  type        = number
  default     = 60
  nullable    = false

  validation {
    condition     = var.capacity_wait_minutes >= 10 && var.capacity_wait_minutes <= 1440
    error_message = "capacity_wait_minutes must be between 10 and 1440 (AWS Batch's maxTimeSeconds allows 600 to 86400 seconds)."
  }
}

################################################################################
# What the jobs reach
################################################################################

variable "fsx" {
  description = "The stack's FSx for Lustre file system (the fsx-lustre module's dns_name, mount_name, security_group_id, lustre_ports), mounted at /fsx on every instance; null: no shared file system."
  type = object({
    dns_name          = string
    mount_name        = string
    security_group_id = string
    ports             = map(list(number))
  })
  default = null
}

variable "kms_key_arn" {
  description = "The stack's KMS key: the root volumes, and the token's secret (the execution role decrypts through Secrets Manager only)."
  type        = string
}

variable "image_repository_arns" {
  description = "ECR repositories the execution role may pull training images from (this stack's)."
  type        = list(string)

  validation {
    condition     = length(var.image_repository_arns) > 0
    error_message = "image_repository_arns needs this stack's ECR repositories (the ecr module's repository_arns)."
  }
}

variable "hf_token_secret_arn" {
  description = "The Hugging Face token's Secrets Manager secret, which Batch injects through the job definition's secrets field (the execution role reads only this secret and mlflow_token_secret_arn); null: jobs get no token."
  type        = string
  default     = null
}

variable "mlflow_token_secret_arn" {
  description = "The Secrets Manager secret of a self-hosted MLflow tracking server's bearer token (MLFLOW_TRACKING_TOKEN), which Batch injects through the job definition's secrets field (the execution role reads it); null: jobs get no such token. A SageMaker managed tracking server needs none."
  type        = string
  default     = null
}

variable "data_source_buckets" {
  description = "S3 buckets the jobs may list and read (data preparation), by name; empty: the job role holds no permission at all."
  type        = list(string)
  default     = []
  nullable    = false
}

variable "tags" {
  description = "Tags of the instances, volumes and network interfaces Batch launches (the provider's default_tags do not reach them); the stack's trainkit:stack-id among them lets the audit find them."
  type        = map(string)
  default     = {}
  nullable    = false
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
