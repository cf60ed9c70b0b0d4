################################################################################
# Cluster
################################################################################

output "cluster_name" {
  description = "EKS cluster name."
  value       = try(aws_eks_cluster.this[0].name, null)
}

output "cluster_endpoint" {
  description = "Kubernetes API endpoint."
  value       = try(aws_eks_cluster.this[0].endpoint, null)
}

output "cluster_certificate_authority_data" {
  description = "Base64 CA certificate of the API endpoint (for kubeconfig)."
  value       = try(aws_eks_cluster.this[0].certificate_authority[0].data, null)
}

output "cluster_security_group_id" {
  description = "Security group EKS attaches to the control plane and managed nodes."
  value       = try(aws_eks_cluster.this[0].vpc_config[0].cluster_security_group_id, null)
}

output "node_role_arn" {
  description = "IAM role of the node groups."
  value       = try(aws_iam_role.node[0].arn, null)
}

output "addons" {
  description = "Installed managed add-ons."
  value       = keys(aws_eks_addon.this)
}

output "secrets_kms_key_arn" {
  description = "KMS key that envelope-encrypts Kubernetes secrets."
  value       = try(one([for c in aws_eks_cluster.this[0].encryption_config : c.provider[0].key_arn if contains(c.resources, "secrets")]), null)
}

output "data_reader" {
  description = "The data-preparation job's service account and the buckets its role may read (empty: no role)."
  value = {
    namespace       = var.data_reader.namespace
    service_account = var.data_reader.service_account
    buckets         = local.data_reader ? var.data_reader.buckets : []
    # what the role's policy names (ListBucket on these, GetObject on <arn>/*) and the association it got
    bucket_arns = local.data_reader ? local.data_reader_bucket_arns : []
    association = [for a in aws_eks_pod_identity_association.data_reader : { namespace = a.namespace, service_account = a.service_account }]
  }
}

output "endpoint_access" {
  description = "The API endpoint's reach: public (bool), the CIDRs the public endpoint admits (null when it is off), private (always true)."
  value = try({
    public              = aws_eks_cluster.this[0].vpc_config[0].endpoint_public_access
    public_access_cidrs = aws_eks_cluster.this[0].vpc_config[0].public_access_cidrs
    private             = aws_eks_cluster.this[0].vpc_config[0].endpoint_private_access
  }, null)
}

################################################################################
# Access entries
################################################################################

output "submitters" {
  description = "The job submitters' access: their principals, the Kubernetes group their access entries carry (the platform stack binds it to PyTorchJobs in the jobs' namespace and to listing nodes), the namespaces where they edit and where they view."
  value = {
    principal_arns   = [for entry in aws_eks_access_entry.submitter : entry.principal_arn]
    kubernetes_group = var.submitter_access.kubernetes_group
    edit_namespaces  = var.submitter_access.edit_namespaces
    view_namespaces  = var.submitter_access.view_namespaces
  }
}

################################################################################
# Node IAM role and the VPC CNI's
################################################################################

output "vpc_cni_role_arn" {
  description = "The VPC CNI's (aws-node) Pod Identity role; null when it uses the node role (pod identity or add-ons off)."
  value       = try(aws_iam_role.vpc_cni[0].arn, null)
}

output "training_identity" {
  description = "The training pods' AWS identity: the service account its Pod Identity association names and the policy its role has; null when they have none."
  value = local.training_identity ? {
    namespace       = aws_eks_pod_identity_association.training[0].namespace
    service_account = aws_eks_pod_identity_association.training[0].service_account
    policy          = aws_iam_role_policy.training[0].policy
  } : null
}
