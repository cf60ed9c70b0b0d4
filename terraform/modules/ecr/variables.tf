################################################################################
# ECR
################################################################################

variable "create" {
  description = "Create the repositories. false creates nothing."
  type        = bool
  default     = true
  nullable    = false
}

variable "name_prefix" {
  description = "Prefix of the repository names, e.g. trainkit -> trainkit/train."
  type        = string
}

variable "repositories" {
  description = "Repository names under the prefix (the training and data-prep images; the infra stack adds idle-guard, the idle guard's image, when the guard is on)."
  type        = list(string)
  default     = ["train", "data-prep"]
}

variable "keep_images" {
  description = "Tagged images kept per repository by the lifecycle policy (older ones expire)."
  type        = number
  default     = 30

  validation {
    condition     = var.keep_images >= 1
    error_message = "keep_images must be at least 1."
  }
}

variable "keep_run_images" {
  description = "Images of submitted runs (tagged run-<id>) kept per repository: a run can be resumed while its image is."
  type        = number
  default     = 500

  validation {
    condition     = var.keep_run_images >= 1
    error_message = "keep_run_images must be at least 1."
  }
}

variable "kms_key_arn" {
  description = "KMS key that encrypts the images."
  type        = string
}

variable "force_delete" {
  description = "Let `make down` delete repositories that still hold images."
  type        = bool
  default     = true
  nullable    = false
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
