################################################################################
# GPU node group
################################################################################

variable "create" {
  description = "Create the GPU node groups. false creates nothing (outputs are empty)."
  type        = bool
  default     = true
  nullable    = false
}

variable "cluster_name" {
  description = "EKS cluster the node groups join."
  type        = string
}

variable "node_role_arn" {
  description = "IAM role of the nodes."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the cluster (for the EFA security group)."
  type        = string
}

variable "subnet_id" {
  description = "The single GPU subnet: all GPU nodes in one AZ, next to FSx, in one cluster placement group."
  type        = string
}

variable "cluster_security_group_id" {
  description = "The cluster security group, attached to every node interface beside the EFA group."
  type        = string
}

variable "kms_key_arn" {
  description = "KMS key that encrypts the root volumes."
  type        = string
}

variable "enable_placement_group" {
  description = "Create a cluster placement group for each node group without a capacity_reservation_id or placement_group_name (off only for emulators that lack the API)."
  type        = bool
  default     = true
  nullable    = false
}

variable "node_groups" {
  description = <<-EOT
    GPU node groups by key. instance_type: one of instance_types.json (p5.48xlarge, p5e.48xlarge,
    p5en.48xlarge, p4d.24xlarge, p4de.24xlarge). desired_size: the nodes the group is created with (0 by
    default: nothing waits for capacity; later changes are ignored, the launcher and the idle guard set it).
    market: on-demand or capacity-block (capacity blocks need capacity_reservation_id). capacity_reservation_id
    (cr-...): launch into that reservation, with no new cluster placement group; placement_group_name: an
    existing cluster placement group to launch into instead (the one the reservation was made in). Root volume
    in GiB must hold the training image.
  EOT
  type = map(object({
    name                    = optional(string)
    instance_type           = optional(string, "p5.48xlarge")
    min_size                = optional(number, 0)
    desired_size            = optional(number, 0)
    max_size                = optional(number, 2)
    market                  = optional(string, "on-demand")
    capacity_reservation_id = optional(string)
    placement_group_name    = optional(string)
    root_volume_gb          = optional(number, 500)
    labels                  = optional(map(string), {})
  }))
  default = { gpu = {} }

  validation {
    condition = alltrue([
      for ng in values(var.node_groups) :
      contains(keys(jsondecode(file("${path.module}/instance_types.json"))), ng.instance_type) && !startswith(ng.instance_type, "_")
    ])
    error_message = "instance_type must be one of p4d.24xlarge, p4de.24xlarge, p5.48xlarge, p5e.48xlarge, p5en.48xlarge (terraform/modules/gpu-nodegroup/instance_types.json)."
  }

  validation {
    condition     = alltrue([for ng in values(var.node_groups) : ng.min_size <= ng.desired_size && ng.desired_size <= ng.max_size])
    error_message = "Each GPU node group needs min_size <= desired_size <= max_size."
  }

  validation {
    condition     = alltrue([for ng in values(var.node_groups) : contains(["on-demand", "capacity-block"], ng.market)])
    error_message = "market must be on-demand or capacity-block."
  }

  validation {
    condition     = alltrue([for ng in values(var.node_groups) : ng.market != "capacity-block" || ng.capacity_reservation_id != null])
    error_message = "A capacity-block node group needs capacity_reservation_id (the capacity block's reservation id, cr-...)."
  }

  validation {
    condition     = alltrue([for ng in values(var.node_groups) : ng.root_volume_gb >= 100])
    error_message = "root_volume_gb must be at least 100 GiB: CUDA training images are tens of GiB."
  }
}

variable "idle_guard" {
  description = <<-EOT
    The idle guard's identity: a Pod Identity role for service_account in namespace (the platform stack's
    CronJob) whose only write is UpdateNodegroupConfig on these node groups. null (default): none. Needs the
    cluster's EKS Pod Identity agent add-on.
  EOT
  type = object({
    namespace       = optional(string, "trainkit-system")
    service_account = optional(string, "trainkit-idle-guard")
  })
  default = null
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
