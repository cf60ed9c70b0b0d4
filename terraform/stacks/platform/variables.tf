################################################################################
# Inputs
################################################################################

variable "infra_state_path" {
  description = "Path of the infra stack's local state file; trainkit sets it (.trainkit/aws/terraform.tfstate)."
  type        = string
}

variable "jobs_namespace" {
  description = "Namespace for training jobs (trainkit.backends.eks.cluster.JOBS_NAMESPACE)."
  type        = string
  default     = "trainkit-jobs"
}

variable "data_service_account" {
  description = "Service account of the data-preparation job; the infra stack's pod identity association names the same (trainkit.backends.eks.cluster.DATA_SERVICE_ACCOUNT)."
  type        = string
  default     = "trainkit-data"
}

variable "training_service_account" {
  description = "Service account of a training job that logs to the infra stack's SageMaker managed MLflow tracking server; the infra stack's pod identity association (mlflow_enabled) names the same (trainkit.backends.eks.cluster.TRAINING_SERVICE_ACCOUNT)."
  type        = string
  default     = "trainkit-training"
}

variable "system_namespace" {
  description = "Namespace for the platform's own services, such as etcd (trainkit.backends.eks.cluster.PLATFORM_NAMESPACE)."
  type        = string
  default     = "trainkit-system"
}

variable "gpu_quota" {
  description = "Most GPUs the jobs namespace may request at once; null = every GPU of the node group (nodes_max x GPUs per node)."
  type        = number
  default     = null
}

variable "etcd_image" {
  description = "etcd image for the rendezvous store; 3.5.x, the last line that serves the v2 API torch's etcd rendezvous uses (v3.5.33: newest 3.5 tag of etcd-io/etcd, 2026-07-23)."
  type        = string
  default     = "quay.io/coreos/etcd:v3.5.33"
}

variable "training_operator_ref" {
  description = "Commit of kubeflow/trainer (the renamed repository of the Kubeflow training operator v1: PyTorchJob with elasticPolicy) whose manifests are applied: a commit, since a tag can be moved. The default is the one tag v1.9.4 names, the latest 1.9 patch (2026-08), whose CRD and webhook the tests check jobs against (tests/schemas/pytorchjob-v1.json)."
  type        = string
  default     = "4445c12aa62e4345b0c2c6ac9b215a70eca46ed7"

  validation {
    condition     = can(regex("^[0-9a-f]{40}$", var.training_operator_ref))
    error_message = "training_operator_ref: a full commit id of kubeflow/trainer (40 hex digits; `git rev-parse v1.9.4^{commit}`), not a tag or branch, which can move."
  }
}

variable "monitoring_namespace" {
  description = "Namespace of kube-prometheus-stack (Prometheus, Grafana) and dcgm-exporter; trainkit/backends/eks/cluster.py names it too."
  type        = string
  default     = "trainkit-monitoring"
}

variable "idle_guard_image" {
  description = "The platform's own image (ECR URI with its tag, in the infra stack's idle-guard repository) that the etcd issuer's Deployment and the idle guard's CronJob run: containers/train/Dockerfile's stage guard, which `make up PROFILE=aws` builds, pushes and sets here. null (no image builder at `make up`): no etcd issuer, so the launcher refuses --rdzv etcd, and no idle guard CronJob, even when the infra stack's idle_guard_minutes is set."
  type        = string
  default     = null
}
