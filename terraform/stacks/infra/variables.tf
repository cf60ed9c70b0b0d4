################################################################################
# Placement
################################################################################

variable "region" {
  description = "AWS region, e.g. us-east-1."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-gov)?-[a-z]+-[0-9]$", var.region))
    error_message = "region must be an AWS region name such as us-east-1."
  }
}

variable "availability_zones" {
  description = "AZs for the private and public subnets (2 to 4, in the region). Must include gpu_availability_zone."
  type        = list(string)

  validation {
    condition     = alltrue([for az in var.availability_zones : startswith(az, var.region)])
    error_message = "Every availability zone must be in the region (e.g. us-east-1a for region us-east-1)."
  }
}

variable "gpu_availability_zone" {
  description = "AZ of the GPU nodes and FSx for Lustre: pick one with capacity for gpu_instance_type."
  type        = string

  validation {
    condition     = startswith(var.gpu_availability_zone, var.region) && contains(var.availability_zones, var.gpu_availability_zone)
    error_message = "gpu_availability_zone must be in the region and listed in availability_zones."
  }
}

################################################################################
# Cluster
################################################################################

variable "name" {
  description = "Name of the stack: the EKS cluster, the ECR prefix and every resource's Name."
  type        = string
  default     = "trainkit"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,30}$", var.name))
    error_message = "name must be 3-31 lowercase letters, digits or '-', starting with a letter."
  }
}

variable "kubernetes_version" {
  description = "EKS Kubernetes version."
  type        = string
  default     = "1.33"
}

variable "admin_principal_arns" {
  description = "IAM roles/users given cluster-admin (AmazonEKSClusterAdminPolicy, cluster-wide) through EKS access entries: the platform's owners (the creator has it already). Job submitters go in submitter_principal_arns."
  type        = list(string)
  default     = []
}

variable "submitter_principal_arns" {
  description = "IAM roles/users that submit jobs: AmazonEKSEditPolicy in the jobs' namespace (trainkit-jobs) and AmazonEKSViewPolicy in trainkit-system, nothing cluster-wide, and the Kubernetes group of the `submitters` output (docs/security.md says what they can and cannot do). A principal is an admin or a submitter, not both."
  type        = list(string)
  default     = []
  nullable    = false
}

variable "endpoint_public_access" {
  description = "Reach the Kubernetes API from the internet, limited to public_access_cidrs (default). false: the private endpoint only, so invoke, kubectl and `make up`'s platform stack must run from inside the VPC (a VPN, Direct Connect or a host there), and public_access_cidrs may be []."
  type        = bool
  default     = true
  nullable    = false
}

variable "public_access_cidrs" {
  description = "IPv4 CIDRs allowed to reach the public Kubernetes API endpoint: where you run invoke/kubectl from, each /16 or narrower. Required ([] only with endpoint_public_access = false)."
  type        = list(string)
  nullable    = false

  validation {
    # IPv4 only: an IPv4 cluster's public endpoint takes no IPv6 CIDR (EKS API Reference, VpcConfigRequest).
    condition = (length(var.public_access_cidrs) > 0 || !var.endpoint_public_access) && alltrue([
      for c in var.public_access_cidrs : can(cidrhost(c, 0)) && can(regex("^[0-9.]+/[0-9]+$", c))
    ])
    error_message = "public_access_cidrs must list at least one valid IPv4 CIDR, e.g. [\"203.0.113.0/24\"] (your office or VPN range); [] only with endpoint_public_access = false."
  }
  validation {
    # A prefix, not a "/0" suffix, so 0.0.0.0/1 + 128.0.0.0/1 (the whole internet in two halves) is refused too. /16:
    # 65,536 addresses, more than any office or VPN egress range needs, while a /8 would let one entry admit a
    # 256th of all IPv4 addresses.
    condition     = var.public_api_open_to_the_internet || alltrue([for c in var.public_access_cidrs : try(tonumber(split("/", c)[1]) >= 16, false)])
    error_message = "public_access_cidrs: each range must be a /16 or narrower (e.g. 203.0.113.0/24), so the API endpoint is not open to large parts of the internet: list where you run invoke/kubectl from, or set public_api_open_to_the_internet = true to accept it."
  }
}

variable "public_api_open_to_the_internet" {
  description = "Allow public_access_cidrs ranges broader than /16, up to 0.0.0.0/0 (the whole internet). Off by default."
  type        = bool
  default     = false
  nullable    = false
}

################################################################################
# GPU nodes
################################################################################

variable "gpu_instance_type" {
  description = "GPU instance type: p5.48xlarge (default), p5e.48xlarge, p5en.48xlarge, p4d.24xlarge, p4de.24xlarge."
  type        = string
  default     = "p5.48xlarge"

  validation {
    condition     = contains(keys(jsondecode(file("${path.module}/../../modules/gpu-nodegroup/instance_types.json"))), var.gpu_instance_type) && !startswith(var.gpu_instance_type, "_")
    error_message = "gpu_instance_type must be one of p4d.24xlarge, p4de.24xlarge, p5.48xlarge, p5e.48xlarge, p5en.48xlarge."
  }
}

variable "gpu_min_nodes" {
  description = "Minimum GPU nodes (0 lets the group scale to nothing between runs)."
  type        = number
  default     = 0

  validation {
    condition     = var.gpu_min_nodes >= 0 && var.gpu_min_nodes <= var.gpu_desired_nodes
    error_message = "gpu_min_nodes must be between 0 and gpu_desired_nodes."
  }
}

variable "gpu_desired_nodes" {
  description = <<-EOT
    GPU nodes the node group is created with. 0 (default): `make up` waits for no GPU capacity (on-demand p5 is
    often not there, and a group that cannot reach its size fails the apply); with idle_guard_minutes set,
    `invoke train --target eks` asks the group for the job's nodes, else scale it with `aws eks
    update-nodegroup-config`. Terraform sets it only when it creates the group: later changes are ignored.
  EOT
  type        = number
  default     = 0

  validation {
    condition     = var.gpu_desired_nodes <= var.gpu_max_nodes
    error_message = "gpu_desired_nodes must not exceed gpu_max_nodes."
  }
}

variable "gpu_max_nodes" {
  description = "Most GPU nodes the group may grow to (elastic jobs scale up to this)."
  type        = number
  default     = 2

  validation {
    condition     = var.gpu_max_nodes >= 1
    error_message = "gpu_max_nodes must be at least 1."
  }
}

variable "idle_guard_minutes" {
  description = <<-EOT
    The idle guard, on by default: when no trainkit job has run on the GPU node group for this many minutes and
    every GPU's DCGM utilisation stayed below 5% for as long, a CronJob scales the group to zero (docs/eks.md, "Idle
    guard"); `invoke train --target eks` asks it for a job's nodes. 30 (default): two p5.48xlarge idle for 30
    minutes cost about $98, while nodes take 10-15 minutes to come back, so a shorter window makes users wait more
    often than it saves. null: off (nodes a job was given stay until you scale the group down). Needs
    gpu_min_nodes = 0 and enable_pod_identity (without pod identity the guard is off).
  EOT
  type        = number
  default     = 30

  validation {
    condition     = var.idle_guard_minutes == null || try(var.idle_guard_minutes >= 10 && var.idle_guard_minutes <= 1440, false)
    error_message = "idle_guard_minutes must be null (off) or 10 to 1440 minutes; 30 is the suggested value."
  }
  validation {
    condition     = var.idle_guard_minutes == null || var.gpu_min_nodes == 0
    error_message = "idle_guard_minutes (default 30) needs gpu_min_nodes = 0, as the guard scales the GPU node group to zero: set gpu_min_nodes = 0, or idle_guard_minutes = null to keep nodes up."
  }
}

variable "gpu_market" {
  description = "on-demand, or capacity-block (needs gpu_capacity_reservation_id; the instance type then goes on the launch template only)."
  type        = string
  default     = "on-demand"
}

variable "gpu_capacity_reservation_id" {
  description = "On-demand capacity reservation or capacity block (cr-...) the GPU nodes launch into; null for none. With one, no cluster placement group is created (a new group around a reservation made outside it can fail to launch); see gpu_placement_group_name."
  type        = string
  default     = null
}

variable "gpu_placement_group_name" {
  description = "An existing cluster placement group the GPU nodes launch into instead of a new one: the one gpu_capacity_reservation_id was made in, if it was. null (default): a new one, or none with a reservation."
  type        = string
  default     = null
}

################################################################################
# Storage
################################################################################

variable "fsx_storage_capacity_gib" {
  description = "FSx for Lustre capacity in GiB: 1200 or a multiple of 2400."
  type        = number
  default     = 2400

  validation {
    condition     = var.fsx_storage_capacity_gib == 1200 || (var.fsx_storage_capacity_gib >= 2400 && var.fsx_storage_capacity_gib % 2400 == 0)
    error_message = "fsx_storage_capacity_gib must be 1200 or a multiple of 2400 (PERSISTENT_2 increments), e.g. 2400, 4800, 9600."
  }
}

variable "fsx_throughput_per_tib" {
  description = "FSx for Lustre PERSISTENT_2 throughput per TiB (125, 250, 500, 1000 MB/s)."
  type        = number
  default     = 250
}

variable "fsx_s3_import_path" {
  description = "s3://bucket/prefix linked to FSx (datasets in, checkpoints out); null for none."
  type        = string
  default     = null
}

variable "fsx_root_squash" {
  description = "Lustre root squash on FSx (terraform/modules/fsx-lustre, root_squash): root on a GPU node, a Batch host or a SageMaker host reaches FSx as nobody (65534:65534), so no container's root can rewrite a run's files. The system nodes' subnets are spared: the platform's one root step (trainkit/backends/eks/fsx.py layout) runs there and gives the file system's root to the jobs' user. false: off, root everywhere is root."
  type        = bool
  default     = true
  nullable    = false
}

variable "fsx_sync_deletions" {
  description = "Propagate deletions between FSx and the S3 path both ways. Off: `rm` on FSx never deletes S3 objects, and objects deleted in S3 stay on FSx until removed there."
  type        = bool
  default     = false
}

################################################################################
# Tags and switches
################################################################################

variable "owner" {
  description = "Who answers for this stack (email or team); tagged on everything."
  type        = string
}

variable "stack_id" {
  description = "Value of the trainkit:stack-id tag on every resource; `invoke infra.audit` finds leftovers by it."
  type        = string
  default     = "trainkit"
}

variable "extra_tags" {
  description = "More tags for every resource."
  type        = map(string)
  default     = {}
}

variable "aws_max_retries" {
  description = "AWS API retries. Keep the default on AWS; emulator runs set it low so errors fail fast."
  type        = number
  default     = 25
}

variable "enable_placement_group" {
  description = "Cluster placement group for the GPU nodes. Off only for emulators without the API."
  type        = bool
  default     = true
  nullable    = false
}

variable "enable_fsx" {
  description = "Create FSx for Lustre. Off only for emulators without the API."
  type        = bool
  default     = true
  nullable    = false
}

variable "enable_eks_addons" {
  description = "Install EKS managed add-ons. Off only for emulators without the API."
  type        = bool
  default     = true
  nullable    = false
}

variable "enable_access_entries" {
  description = "Create EKS access entries. Off only for emulators without the API."
  type        = bool
  default     = true
  nullable    = false
}

variable "enable_pod_identity" {
  description = "Create EKS pod identity associations. Off only for emulators without the API."
  type        = bool
  default     = true
  nullable    = false
}

variable "data_source_buckets" {
  description = "S3 buckets the data-preparation job may list and read (invoke data.imagenet --target eks --source s3://<bucket>/...); bucket names, not URLs. Empty: the job has no S3 access."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for b in var.data_source_buckets : can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", b))])
    error_message = "data_source_buckets: bucket names only (e.g. [\"my-datasets\"]), not s3:// URLs or ARNs."
  }
}

variable "sagemaker_enabled" {
  description = "Create what `--target sagemaker` jobs need: an execution role, an encrypted runs bucket, a security group, the Hugging Face token's secret (docs/sagemaker.md)."
  type        = bool
  default     = false
}

variable "sagemaker_inter_container_traffic_encryption" {
  description = "Encrypt the traffic between a SageMaker job's instances (EnableInterContainerTrafficEncryption). Off by default: SageMaker says it makes distributed training take longer, by how much depends on the communication between instances, which data-parallel training does at every step; the job's instances admit traffic only from their own security group (docs/security.md)."
  type        = bool
  default     = false
  nullable    = false
}

variable "sagemaker_checkpoint_retention_days" {
  description = "Days after which SageMaker checkpoints in the runs bucket expire."
  type        = number
  default     = 30
}

################################################################################
# AWS Batch (opt-in)
################################################################################

variable "batch_enabled" {
  description = "Create what `--target batch` multi-node jobs need (docs/aws.md, AWS Batch): an EC2 On-Demand compute environment of GPU instances with every EFA interface, in the GPU subnet and a cluster placement group, scaling from 0; a job queue; the instance, execution and job roles; the Hugging Face token's secret (one with SageMaker). Needs enable_fsx: the instances mount FSx for Lustre at /fsx."
  type        = bool
  default     = false
  nullable    = false

  validation {
    condition     = !var.batch_enabled || var.enable_fsx
    error_message = "batch_enabled needs enable_fsx = true: Batch jobs keep their run folders on FSx for Lustre (/fsx)."
  }
}

variable "batch_instance_types" {
  description = "Instance types of the Batch compute environment, sharing one EFA layout: p5.48xlarge (with p5e.48xlarge), p5en.48xlarge, p4d.24xlarge (with p4de.24xlarge). null: [gpu_instance_type]. The first one sizes max vCPUs. No Spot: Batch runs multi-node jobs on On-Demand instances only."
  type        = list(string)
  default     = null

  validation {
    condition = var.batch_instance_types == null || try(length(var.batch_instance_types) > 0 && alltrue([
      for type in var.batch_instance_types : contains(keys(module.gpu_nodegroup.efa_interfaces), type)
    ]), false)
    error_message = "batch_instance_types must list some of p4d.24xlarge, p4de.24xlarge, p5.48xlarge, p5e.48xlarge, p5en.48xlarge (or be null: gpu_instance_type)."
  }
  validation {
    # One launch template serves every type (its interfaces are the first type's): the gpu-nodegroup module's
    # layout of each, computed once there.
    condition = var.batch_instance_types == null || try(length(distinct([
      for type in var.batch_instance_types : module.gpu_nodegroup.efa_interfaces[type]
    ])) == 1, true)
    error_message = "batch_instance_types must share one EFA layout (one launch template serves them all): p5.48xlarge with p5e.48xlarge, or p4d.24xlarge with p4de.24xlarge; p5en.48xlarge (16 interfaces) alone."
  }
}

variable "batch_max_nodes" {
  description = "Most Batch instances (of the first batch_instance_types) running at once: max vCPUs = this x its vCPUs (192 on p5.48xlarge), so the most nodes one job can span. Min vCPUs is 0: nothing bills between jobs."
  type        = number
  default     = 2
  nullable    = false

  validation {
    condition     = var.batch_max_nodes >= 1 && floor(var.batch_max_nodes) == var.batch_max_nodes
    error_message = "batch_max_nodes must be a whole number of at least 1."
  }
}

variable "batch_capacity_wait_minutes" {
  description = "Minutes a Batch job may wait for GPU capacity (RUNNABLE) before the queue cancels it, 10 to 1440: a half-provisioned multi-node job bills the instances it already holds."
  type        = number
  default     = 60
  nullable    = false

  validation {
    condition     = var.batch_capacity_wait_minutes >= 10 && var.batch_capacity_wait_minutes <= 1440
    error_message = "batch_capacity_wait_minutes must be between 10 and 1440 (AWS Batch cancels after 600 to 86400 seconds)."
  }
}

variable "batch_ami_id" {
  description = "AMI of the Batch instances; null: the Amazon ECS-optimized Amazon Linux 2023 GPU AMI that AWS Batch picks (ECS_AL2023_NVIDIA). Set an ECS GPU AMI with the EFA software if that one lacks it."
  type        = string
  default     = null
}

################################################################################
# Experiment tracking: SageMaker managed MLflow (opt-in)
################################################################################

variable "mlflow_enabled" {
  description = "Create a SageMaker managed MLflow tracking server (docs/tracking.md): `--track mlflow` on AWS then logs there without a --tracking-uri, and the SageMaker and Batch job roles may log to it."
  type        = bool
  default     = false
  nullable    = false
}

variable "mlflow_tracking_server_size" {
  description = "The tracking server's size: Small, Medium or Large."
  type        = string
  default     = "Small"
  nullable    = false
}
