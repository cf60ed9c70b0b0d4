################################################################################
# Network
################################################################################

variable "create" {
  description = "Create the network. false creates nothing (outputs are null)."
  type        = bool
  default     = true
  nullable    = false
}

variable "name" {
  description = "Name prefix for every network resource."
  type        = string
}

variable "cidr" {
  description = "VPC IPv4 CIDR. A /16 leaves room for the GPU subnet's many EFA/pod addresses."
  type        = string
  default     = "10.0.0.0/16"

  validation {
    condition     = can(cidrhost(var.cidr, 0)) && tonumber(split("/", var.cidr)[1]) <= 18
    error_message = "cidr must be a valid IPv4 CIDR of size /18 or larger (e.g. 10.0.0.0/16)."
  }
}

variable "azs" {
  description = "Availability zones for the private and public subnets (at least 2, all in the provider's region)."
  type        = list(string)

  validation {
    condition     = length(var.azs) >= 2 && length(var.azs) <= 4
    error_message = "azs must list 2 to 4 availability zones (EKS needs subnets in at least two)."
  }
}

variable "gpu_az" {
  description = "Availability zone of the GPU subnet, where the GPU nodes and FSx for Lustre live. Must be one of azs."
  type        = string

  validation {
    condition     = contains(var.azs, var.gpu_az)
    error_message = "gpu_az must be one of azs."
  }
}

variable "enable_flow_logs" {
  description = "Send VPC flow logs to a KMS-encrypted CloudWatch log group."
  type        = bool
  default     = true
  nullable    = false
}

variable "flow_log_retention_days" {
  description = "Retention of the flow log group in days (CloudWatch allowed values, e.g. 90, 365)."
  type        = number
  default     = 365
}

variable "kms_key_arn" {
  description = "KMS key that encrypts the flow log group."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags added to every resource (the provider's default_tags apply too)."
  type        = map(string)
  default     = {}
}
