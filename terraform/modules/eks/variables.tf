################################################################################
# Cluster
################################################################################

variable "create" {
  description = "Create the cluster. false creates nothing (outputs are null)."
  type        = bool
  default     = true
  nullable    = false
}

variable "name" {
  description = "Cluster name."
  type        = string

  validation {
    condition     = can(regex("^[a-zA-Z][a-zA-Z0-9-]{0,99}$", var.name))
    error_message = "name must start with a letter and contain only letters, digits and '-', at most 100 characters."
  }
}

variable "kubernetes_version" {
  description = "EKS Kubernetes version, e.g. 1.33."
  type        = string
  default     = "1.33"

  validation {
    condition     = can(regex("^1\\.[0-9]+$", var.kubernetes_version))
    error_message = "kubernetes_version must look like 1.33."
  }
}

variable "vpc_id" {
  description = "VPC of the cluster."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets (at least two AZs) for the control-plane ENIs and the system node group."
  type        = list(string)
}

variable "endpoint_public_access" {
  description = "Expose the Kubernetes API endpoint publicly (restricted to public_access_cidrs). false: the private endpoint only, reachable from inside the VPC. The private endpoint is always on."
  type        = bool
  default     = true
  nullable    = false
}

variable "public_access_cidrs" {
  description = "IPv4 CIDRs allowed to reach the public API endpoint (your office/VPN ranges). Required while endpoint_public_access is on: no open default. The caller decides how broad a range it accepts (the infra stack refuses any broader than /16)."
  type        = list(string)
  nullable    = false

  validation {
    # IPv4 only: an IPv4 cluster's public endpoint takes no IPv6 CIDR (EKS API Reference, VpcConfigRequest).
    condition = (length(var.public_access_cidrs) > 0 || !var.endpoint_public_access) && alltrue([
      for c in var.public_access_cidrs : can(cidrhost(c, 0)) && can(regex("^[0-9.]+/[0-9]+$", c))
    ])
    error_message = "public_access_cidrs must list at least one valid IPv4 CIDR while endpoint_public_access is on, e.g. [\"203.0.113.0/24\"]."
  }
}

variable "log_types" {
  description = "Control-plane log types sent to CloudWatch (api, audit, authenticator, controllerManager, scheduler)."
  type        = list(string)
  default     = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
}

variable "log_retention_days" {
  description = "Retention of the control-plane log group in days."
  type        = number
  default     = 365
}

variable "kms_key_arn" {
  description = "KMS key for envelope encryption of Kubernetes secrets and for the log group."
  type        = string
}

variable "admin_principal_arns" {
  description = "IAM principals given cluster-admin (AmazonEKSClusterAdminPolicy, cluster-wide) through EKS access entries: the platform's owners. The caller is added by EKS itself."
  type        = list(string)
  default     = []
  nullable    = false
}

variable "submitter_principal_arns" {
  description = "IAM principals that submit jobs: AmazonEKSEditPolicy in submitter_access.edit_namespaces and AmazonEKSViewPolicy in submitter_access.view_namespaces, nothing cluster-wide, and the Kubernetes group submitter_access.kubernetes_group. None of them may also be an admin (EKS allows one access entry per principal)."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    # EKS User Guide, "Create access entries": "An IAM principal can't be included in more than one access entry."
    condition     = length(setintersection(var.submitter_principal_arns, var.admin_principal_arns)) == 0
    error_message = "A principal is in both admin_principal_arns and submitter_principal_arns: EKS allows one access entry per principal; list it in one."
  }
}

variable "submitter_access" {
  description = "Where submitters act: edit_namespaces get AmazonEKSEditPolicy (the jobs' namespace), view_namespaces AmazonEKSViewPolicy (the platform's, where the idle guard's status lives); kubernetes_group is the group their access entries carry, which the platform stack binds to PyTorchJobs and to listing nodes (access policies have neither)."
  type = object({
    edit_namespaces  = optional(list(string), ["trainkit-jobs"])
    view_namespaces  = optional(list(string), ["trainkit-system"])
    kubernetes_group = optional(string, "trainkit-submitters")
  })
  default  = {}
  nullable = false
}

variable "enable_access_entries" {
  description = "Create access entries for admin_principal_arns and submitter_principal_arns (off only for emulators that lack the API)."
  type        = bool
  default     = true
  nullable    = false
}

variable "addons" {
  description = "Managed add-ons by name; version null = the default for the cluster version."
  type = map(object({
    version              = optional(string)
    configuration_values = optional(string)
  }))
  default = {
    # The VPC CNI enforces NetworkPolicy objects only with its policy agent on (the platform's policy
    # that admits only the jobs' namespace to etcd relies on it).
    vpc-cni                = { configuration_values = "{\"enableNetworkPolicy\":\"true\"}" }
    coredns                = {}
    kube-proxy             = {}
    eks-pod-identity-agent = {}
    aws-fsx-csi-driver     = {}
    # The platform's etcd keeps its data on an EBS volume of its own (terraform/stacks/platform), not on the FSx
    # every job mounts.
    aws-ebs-csi-driver = {}
  }
}

variable "enable_addons" {
  description = "Install the managed add-ons (off only for emulators that lack the API)."
  type        = bool
  default     = true
  nullable    = false
}

variable "enable_pod_identity" {
  description = "Create the pod identity roles and associations: the VPC CNI's (then the node role carries no AmazonEKS_CNI_Policy), the FSx CSI controller's, the data-preparation job's. Off only for emulators."
  type        = bool
  default     = true
  nullable    = false
}

variable "system_node_group" {
  description = "Small CPU node group for cluster services (CoreDNS, operators, Prometheus)."
  type = object({
    instance_types = optional(list(string), ["m7i.xlarge"])
    min_size       = optional(number, 2)
    desired_size   = optional(number, 2)
    max_size       = optional(number, 4)
    disk_size_gb   = optional(number, 100)
  })
  default  = {}
  nullable = false

  validation {
    condition     = var.system_node_group.min_size <= var.system_node_group.desired_size && var.system_node_group.desired_size <= var.system_node_group.max_size
    error_message = "system_node_group needs min_size <= desired_size <= max_size."
  }
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}

variable "fsx_scope_tag" {
  description = "Tag (key, value) of the FSx file systems the FSx CSI driver may update; null: every file system of the account."
  type = object({
    key   = string
    value = string
  })
  default = null
}

variable "data_reader" {
  description = "Read access to S3 for the data-preparation job (invoke data.imagenet --target eks): the Kubernetes namespace and service account it runs as, and the buckets it may list and read. No buckets: no role, no association."
  type = object({
    namespace       = optional(string, "trainkit-jobs")
    service_account = optional(string, "trainkit-data")
    buckets         = optional(list(string), [])
  })
  default  = {}
  nullable = false

  validation {
    # S3 bucket naming rules (general purpose buckets): 3-63 of a-z, 0-9, '.', '-', starting and ending alphanumeric.
    condition     = alltrue([for b in var.data_reader.buckets : can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", b))])
    error_message = "data_reader.buckets: bucket names only (e.g. my-datasets), not s3:// URLs or ARNs."
  }
}

variable "training_identity" {
  description = "AWS credentials for the training pods (EKS Pod Identity), for what they reach with them: today the stack's SageMaker managed MLflow tracking server (`policy_json`: the mlflow module's client policy). The namespace and service account the pods run as; no policy: no role, no association, and the pods have no AWS credentials."
  type = object({
    namespace       = optional(string, "trainkit-jobs")
    service_account = optional(string, "trainkit-training")
    enabled         = optional(bool, false)
    policy_json     = optional(string)
  })
  default  = {}
  nullable = false
}
