################################################################################
# FSx for Lustre
################################################################################

variable "create" {
  description = "Create the file system. false creates nothing (outputs are null)."
  type        = bool
  default     = true
  nullable    = false
}

variable "name" {
  description = "Name prefix."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the file system's security group."
  type        = string
}

variable "subnet_id" {
  description = "The GPU subnet: FSx lives in the GPU nodes' AZ (no cross-AZ traffic or charges)."
  type        = string
}

variable "client_security_group_ids" {
  description = "Security groups of the Lustre clients (the EKS cluster security group, the EFA group)."
  type        = list(string)
}

variable "storage_capacity_gib" {
  description = "Capacity in GiB. PERSISTENT_2 allows 1200 or a multiple of 2400."
  type        = number
  default     = 2400

  validation {
    condition     = var.storage_capacity_gib == 1200 || (var.storage_capacity_gib >= 2400 && var.storage_capacity_gib % 2400 == 0)
    error_message = "storage_capacity_gib must be 1200 or a multiple of 2400 (PERSISTENT_2 increments), e.g. 2400, 4800, 9600."
  }
}

variable "throughput_per_tib" {
  description = "PERSISTENT_2 throughput in MB/s per TiB: 125, 250, 500 or 1000."
  type        = number
  default     = 250

  validation {
    condition     = contains([125, 250, 500, 1000], var.throughput_per_tib)
    error_message = "throughput_per_tib must be one of 125, 250, 500, 1000."
  }
}

variable "kms_key_arn" {
  description = "KMS key that encrypts the file system."
  type        = string
}

variable "s3_import_path" {
  description = "Optional s3://bucket/prefix linked to the file system (data repository association); null for none."
  type        = string
  default     = null

  validation {
    condition     = var.s3_import_path == null || can(regex("^s3://[a-z0-9.-]{3,63}(/.*)?$", var.s3_import_path))
    error_message = "s3_import_path must look like s3://bucket or s3://bucket/prefix."
  }
}

variable "sync_deletions" {
  description = "Also propagate deletions between S3 and the file system (both ways). Off: deleting files on FSx never deletes S3 objects."
  type        = bool
  default     = false
}

variable "root_squash" {
  description = <<-EOT
    Lustre root squash: a client's root user (UID 0, e.g. a pod running as root) reaches the file system as uid_gid
    ("UID:GID", both non-zero; "65534:65534" is nobody) instead of as root, except from the clients in
    no_squash_nids (Lustre NIDs such as 10.0.1.6@tcp, or ranges such as 10.0.[2-10].[1-255]@tcp). null (default): off.
    The infra stack turns it on, sparing its system nodes (trainkit/backends/eks/fsx.py says why).
  EOT
  type = object({
    uid_gid        = optional(string, "65534:65534")
    no_squash_nids = optional(list(string), [])
  })
  default = null

  # FSx API Reference, LustreRootSquashConfiguration: RootSquash "UID:GID" (0 would mean root, i.e. no squash),
  # NoSquashNids at most 64, each matching ^([0-9\[\]\-]*\.){3}([0-9\[\]\-]*)@tcp$.
  validation {
    condition     = var.root_squash == null || can(regex("^[1-9][0-9]*:[1-9][0-9]*$", var.root_squash.uid_gid))
    error_message = "root_squash.uid_gid must be \"UID:GID\" with both non-zero, e.g. \"65534:65534\" (0 would squash to root: no squash)."
  }
  validation {
    condition = var.root_squash == null || try(length(var.root_squash.no_squash_nids) <= 64 && alltrue([
      for nid in var.root_squash.no_squash_nids : can(regex("^([0-9\\[\\]-]*\\.){3}([0-9\\[\\]-]*)@tcp$", nid))
    ]), false)
    error_message = "root_squash.no_squash_nids: at most 64 Lustre NIDs such as 10.0.1.6@tcp or 10.0.[2-10].[1-255]@tcp."
  }
}

variable "repository_mount_path" {
  description = "Where the S3 data appears inside the file system."
  type        = string
  default     = "/data"
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
