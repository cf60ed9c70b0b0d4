################################################################################
# What the launcher needs
################################################################################

output "region" {
  description = "AWS region of the stack."
  value       = var.region
}

output "cluster_name" {
  description = "EKS cluster name."
  value       = module.eks.cluster_name
}

output "cluster_endpoint" {
  description = "Kubernetes API endpoint."
  value       = module.eks.cluster_endpoint
}

output "cluster_certificate_authority_data" {
  description = "Base64 CA certificate of the API endpoint."
  value       = module.eks.cluster_certificate_authority_data
}

output "fsx_file_system_id" {
  description = "FSx for Lustre id (null when FSx is switched off)."
  value       = module.fsx_lustre.file_system_id
}

output "fsx_mount_name" {
  description = "FSx for Lustre mount name."
  value       = module.fsx_lustre.mount_name
}

output "fsx_dns_name" {
  description = "FSx for Lustre DNS name."
  value       = module.fsx_lustre.dns_name
}

output "ecr_repository_urls" {
  description = "ECR repository URLs by image (train, data-prep; idle-guard when idle_guard_minutes is set)."
  value       = module.ecr.repository_urls
}

output "gpu_instance_type" {
  description = "GPU instance type of the training nodes."
  value       = var.gpu_instance_type
}

output "gpu_nodes_max" {
  description = "Most GPU nodes available to a job."
  value       = var.gpu_max_nodes
}

output "gpus_per_node" {
  description = "GPUs per GPU node."
  value       = module.gpu_nodegroup.node_groups["gpu"].gpus_per_node
}

output "efa_interfaces_per_node" {
  description = "EFA interfaces per GPU node (the vpc.amazonaws.com/efa resource a pod may request)."
  value       = module.gpu_nodegroup.node_groups["gpu"].efa_per_node
}

output "gpu_availability_zone" {
  description = "AZ of the GPU nodes and FSx."
  value       = module.network.gpu_az
}

output "stack_id" {
  description = "Value of the trainkit:stack-id tag on every resource."
  value       = var.stack_id
}

output "kms_key_arn" {
  description = "The stack's KMS key: the platform's etcd volume is encrypted with it (its StorageClass)."
  value       = aws_kms_key.this.arn
}

output "fsx_storage_capacity_gib" {
  description = "FSx for Lustre capacity in GiB (the platform stack sizes its volume claims with it)."
  value       = var.fsx_storage_capacity_gib
}

output "fsx_throughput_per_tib" {
  description = "FSx for Lustre throughput per TiB, MB/s (the stall watchdog allows a checkpoint its bytes at this times the capacity)."
  value       = var.fsx_throughput_per_tib
}

output "data_reader" {
  description = "The data-preparation job's namespace, service account and readable buckets (invoke data.imagenet --target eks)."
  value       = { for key in ["namespace", "service_account", "buckets"] : key => module.eks.data_reader[key] }
}

output "gpu_nodegroup" {
  description = "The GPU node group as EKS names it (cluster, region, node group): `invoke train --target eks` asks it for a job's nodes."
  value = {
    cluster_name = module.eks.cluster_name
    region       = var.region
    nodegroup    = module.gpu_nodegroup.node_groups["gpu"].name
  }
}

output "idle_guard" {
  description = "The idle guard the platform stack runs (cluster, node group, window, namespace, service account); null when idle_guard_minutes is null or pod identity is off."
  value = module.gpu_nodegroup.idle_guard == null ? null : {
    cluster_name    = module.eks.cluster_name
    region          = var.region
    nodegroup       = module.gpu_nodegroup.idle_guard.node_groups[0]
    window_minutes  = var.idle_guard_minutes
    namespace       = module.gpu_nodegroup.idle_guard.namespace
    service_account = module.gpu_nodegroup.idle_guard.service_account
  }
}

output "submitters" {
  description = "Job submitters' EKS access: principals, the Kubernetes group their access entries carry (the platform stack binds it to PyTorchJobs in the jobs' namespace and to listing nodes), the namespaces they edit and view."
  value       = module.eks.submitters
}

output "sagemaker" {
  description = "The SageMaker part (role, bucket, subnets, security group, the Hugging Face and MLflow token secrets, the stack's KMS key for the jobs' outputs and volumes, inter-container traffic encryption); null unless sagemaker_enabled."
  value       = module.sagemaker.sagemaker
}

output "batch" {
  description = "The AWS Batch part (job queue, compute environment, roles, instance types, FSx mount path, log group, the Hugging Face and MLflow token secrets, max nodes); null unless batch_enabled."
  value       = module.batch.batch
}

output "mlflow" {
  description = "The SageMaker managed MLflow tracking server (its ARN: a tracked job's default --tracking-uri on AWS; its UI's URL; the artifact bucket); null unless mlflow_enabled."
  value       = module.mlflow.mlflow
}
