################################################################################
# Cluster
################################################################################

data "aws_partition" "current" {}
data "aws_caller_identity" "current" {}

locals {
  create    = var.create
  partition = data.aws_partition.current.partition
  policy    = "arn:${data.aws_partition.current.partition}:iam::aws:policy"
}

data "aws_iam_policy_document" "cluster_assume" {
  statement {
    actions = ["sts:AssumeRole", "sts:TagSession"]
    principals {
      type        = "Service"
      identifiers = ["eks.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "cluster" {
  count = local.create ? 1 : 0

  name_prefix        = "${substr(var.name, 0, 24)}-cluster-"
  assume_role_policy = data.aws_iam_policy_document.cluster_assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "cluster" {
  count = local.create ? 1 : 0

  role       = aws_iam_role.cluster[0].name
  policy_arn = "${local.policy}/AmazonEKSClusterPolicy"
}

resource "aws_cloudwatch_log_group" "cluster" {
  count = local.create ? 1 : 0

  # EKS writes to this fixed name; creating it first sets retention and encryption.
  name              = "/aws/eks/${var.name}/cluster"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = var.tags
}

resource "aws_eks_cluster" "this" {
  count = local.create ? 1 : 0

  # The public endpoint is how operators run invoke/kubectl from outside the VPC; it is limited to
  # public_access_cidrs (required, no default) and turned off with endpoint_public_access = false.
  #checkov:skip=CKV_AWS_39:public endpoint is deliberate, restricted by the required public_access_cidrs
  #checkov:skip=CKV_AWS_38:public_access_cidrs is required, validated and has no open default

  name                      = var.name
  version                   = var.kubernetes_version
  role_arn                  = aws_iam_role.cluster[0].arn
  enabled_cluster_log_types = var.log_types

  vpc_config {
    subnet_ids              = var.subnet_ids
    endpoint_private_access = true
    #trivy:ignore:AVD-AWS-0040 public endpoint is deliberate, limited to public_access_cidrs
    endpoint_public_access = var.endpoint_public_access
    # Without the public endpoint the list means nothing (EKS API Reference, VpcConfigRequest.publicAccessCidrs).
    public_access_cidrs = var.endpoint_public_access ? var.public_access_cidrs : null
  }

  access_config {
    authentication_mode                         = "API"
    bootstrap_cluster_creator_admin_permissions = true
  }

  encryption_config {
    resources = ["secrets"]
    provider {
      key_arn = var.kms_key_arn
    }
  }

  tags = var.tags

  depends_on = [aws_iam_role_policy_attachment.cluster, aws_cloudwatch_log_group.cluster]
}

################################################################################
# Access entries
#
# Admins (the platform's owners) get cluster-admin; submitters get AmazonEKSEditPolicy in the jobs' namespace and
# AmazonEKSViewPolicy in the platform's, nothing cluster-wide. The policies' rules: EKS User Guide, "Review access
# policy permissions" (https://docs.aws.amazon.com/eks/latest/userguide/access-policy-permissions.html).
################################################################################

locals {
  access_entries = local.create && var.enable_access_entries
  submitter_policies = {
    edit = { policy = "AmazonEKSEditPolicy", namespaces = var.submitter_access.edit_namespaces }
    view = { policy = "AmazonEKSViewPolicy", namespaces = var.submitter_access.view_namespaces }
  }
  submitter_associations = {
    for pair in setproduct(var.submitter_principal_arns, keys(local.submitter_policies)) : "${pair[1]} ${pair[0]}" => {
      principal_arn = pair[0]
      policy        = local.submitter_policies[pair[1]].policy
      namespaces    = local.submitter_policies[pair[1]].namespaces
    } if length(local.submitter_policies[pair[1]].namespaces) > 0
  }
}

resource "aws_eks_access_entry" "admin" {
  for_each = local.access_entries ? toset(var.admin_principal_arns) : toset([])

  cluster_name  = aws_eks_cluster.this[0].name
  principal_arn = each.value
  tags          = var.tags
}

resource "aws_eks_access_policy_association" "admin" {
  for_each = aws_eks_access_entry.admin

  cluster_name  = aws_eks_cluster.this[0].name
  principal_arn = each.value.principal_arn
  policy_arn    = "arn:${local.partition}:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"

  access_scope {
    type = "cluster"
  }
}

# A submitter's entry also carries a Kubernetes group, which the platform stack binds to what the access policies
# lack: kubeflow.org PyTorchJobs in the jobs' namespace and listing nodes (EKS User Guide, "Create access entries":
# an entry's kubernetes_groups are the groups RoleBindings and ClusterRoleBindings name).
resource "aws_eks_access_entry" "submitter" {
  for_each = local.access_entries ? toset(var.submitter_principal_arns) : toset([])

  cluster_name      = aws_eks_cluster.this[0].name
  principal_arn     = each.value
  kubernetes_groups = [var.submitter_access.kubernetes_group]
  tags              = var.tags
}

resource "aws_eks_access_policy_association" "submitter" {
  for_each = local.access_entries ? local.submitter_associations : {}

  cluster_name  = aws_eks_cluster.this[0].name
  principal_arn = aws_eks_access_entry.submitter[each.value.principal_arn].principal_arn
  policy_arn    = "arn:${local.partition}:eks::aws:cluster-access-policy/${each.value.policy}"

  access_scope {
    type       = "namespace"
    namespaces = each.value.namespaces
  }
}

################################################################################
# Node IAM role (system and GPU node groups)
################################################################################

data "aws_iam_policy_document" "node_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "node" {
  count = local.create ? 1 : 0

  name_prefix        = "${substr(var.name, 0, 24)}-node-"
  assume_role_policy = data.aws_iam_policy_document.node_assume.json
  tags               = var.tags
}

locals {
  # The VPC CNI (aws-node) gets AmazonEKS_CNI_Policy through its own Pod Identity role when the cluster has both
  # add-ons and Pod Identity; only otherwise (emulators) does the node role carry it, where every process on the node
  # that reaches IMDS could use it.
  vpc_cni_pod_identity = (
    local.create && var.enable_addons && var.enable_pod_identity
    && contains(keys(var.addons), "vpc-cni") && contains(keys(var.addons), "eks-pod-identity-agent")
  )
  node_policies = concat(
    ["AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly"],
    local.vpc_cni_pod_identity ? [] : ["AmazonEKS_CNI_Policy"],
  )
}

resource "aws_iam_role_policy_attachment" "node" {
  for_each = local.create ? toset(local.node_policies) : toset([])

  role       = aws_iam_role.node[0].name
  policy_arn = "${local.policy}/${each.value}"
}

################################################################################
# System node group
################################################################################

resource "aws_launch_template" "system" {
  count = local.create ? 1 : 0

  name_prefix = "${var.name}-system-"

  metadata_options {
    http_endpoint = "enabled"
    http_tokens   = "required" # IMDSv2 only
    # Hop limit 1: a pod in its own network namespace is one hop further and gets no IMDSv2 token, so Grafana,
    # Prometheus, etcd, the operator and the data-preparation job cannot borrow the node role; what needs AWS among
    # them has its own Pod Identity role. Pods with hostNetwork stay at one hop and keep IMDS: aws-node (the VPC
    # CNI, which also reads its ENI layout there), kube-proxy, the Pod Identity agent (EKS User Guide, "Amazon EKS
    # security best practices", restricting IMDS: IMDSv2 with hop limit 1 blocks containers "that don't use host
    # networking"). The FSx CSI controller then reads its instance id from its Node's providerID, but no region
    # (aws-fsx-csi-driver pkg/cloud/metadata_k8s.go, metadataForEC2Node): its own FSx API calls (dynamic
    # provisioning, resize) would fail. The platform's volume is static (a PersistentVolume of the stack's file
    # system), which the node plugin mounts without the controller; a dynamic one would need the region set.
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = var.system_node_group.disk_size_gb
      volume_type           = "gp3"
      encrypted             = true
      kms_key_id            = var.kms_key_arn
      delete_on_termination = true
    }
  }

  # What the node group launches carries the tags too (the provider's default_tags reach only what Terraform itself
  # creates), so the audit finds instances, root volumes and network interfaces by the stack id. These three are the
  # types a launch template can tag (EC2 API reference, LaunchTemplateTagSpecificationRequest).
  dynamic "tag_specifications" {
    for_each = toset(["instance", "volume", "network-interface"])
    content {
      resource_type = tag_specifications.value
      tags          = merge(var.tags, { Name = "${var.name}-system" })
    }
  }

  tags = var.tags
}

resource "aws_eks_node_group" "system" {
  count = local.create ? 1 : 0

  cluster_name    = aws_eks_cluster.this[0].name
  node_group_name = "system"
  node_role_arn   = aws_iam_role.node[0].arn
  subnet_ids      = var.subnet_ids
  ami_type        = "AL2023_x86_64_STANDARD"
  instance_types  = var.system_node_group.instance_types

  launch_template {
    id      = aws_launch_template.system[0].id
    version = aws_launch_template.system[0].latest_version
  }

  scaling_config {
    min_size     = var.system_node_group.min_size
    desired_size = var.system_node_group.desired_size
    max_size     = var.system_node_group.max_size
  }

  labels = { "trainkit/pool" = "system" }
  tags   = var.tags

  # The nodes come up with the VPC CNI and the Pod Identity agent as configured below, so aws-node starts with its
  # own role's credentials, never the node role's.
  depends_on = [aws_iam_role_policy_attachment.node, aws_eks_addon.before_nodes]
}

################################################################################
# Managed add-ons, the VPC CNI's and the FSx CSI driver's pod identities
################################################################################

locals {
  addons = local.create && var.enable_addons ? var.addons : {}
  # DaemonSets the nodes need from their first minute, made before the node group (terraform-aws-eks's
  # `before_compute` add-ons): the VPC CNI, so that aws-node runs with its Pod Identity role from the start, and the
  # Pod Identity agent that hands it those credentials (hostNetwork: it needs no pod network itself).
  addons_before_nodes = ["vpc-cni", "eks-pod-identity-agent"]
}

resource "aws_eks_addon" "before_nodes" {
  for_each = { for name, addon in local.addons : name => addon if contains(local.addons_before_nodes, name) }

  cluster_name                = aws_eks_cluster.this[0].name
  addon_name                  = each.key
  addon_version               = each.value.version
  configuration_values        = each.value.configuration_values
  resolve_conflicts_on_create = "OVERWRITE"
  resolve_conflicts_on_update = "PRESERVE"
  tags                        = var.tags

  # The VPC CNI supports EKS Pod Identity (EKS User Guide, "Configure Amazon VPC CNI plugin to use IRSA", note;
  # "IAM roles for Amazon EKS add-ons": an add-on creates its associations itself). aws-node is its service account.
  dynamic "pod_identity_association" {
    for_each = each.key == "vpc-cni" && local.vpc_cni_pod_identity ? [aws_iam_role.vpc_cni[0].arn] : []
    content {
      role_arn        = pod_identity_association.value
      service_account = local.pod_identities.vpc_cni.service_account
    }
  }

  depends_on = [aws_iam_role_policy_attachment.vpc_cni]
}

moved {
  from = aws_eks_addon.this["vpc-cni"]
  to   = aws_eks_addon.before_nodes["vpc-cni"]
}

moved {
  from = aws_eks_addon.this["eks-pod-identity-agent"]
  to   = aws_eks_addon.before_nodes["eks-pod-identity-agent"]
}

resource "aws_eks_addon" "this" {
  for_each = { for name, addon in local.addons : name => addon if !contains(local.addons_before_nodes, name) }

  cluster_name                = aws_eks_cluster.this[0].name
  addon_name                  = each.key
  addon_version               = each.value.version
  configuration_values        = each.value.configuration_values
  resolve_conflicts_on_create = "OVERWRITE"
  resolve_conflicts_on_update = "PRESERVE"
  tags                        = var.tags

  # CoreDNS and the CSI controllers need nodes to schedule on.
  depends_on = [aws_eks_node_group.system]
}

locals {
  # The service accounts that get a Pod Identity role here; each role may be assumed for its own one only.
  pod_identities = {
    vpc_cni     = { create = local.vpc_cni_pod_identity, namespace = "kube-system", service_account = "aws-node" }
    fsx_csi     = { create = local.create && var.enable_pod_identity, namespace = "kube-system", service_account = "fsx-csi-controller-sa" }
    ebs_csi     = { create = local.ebs_csi, namespace = "kube-system", service_account = "ebs-csi-controller-sa" }
    data_reader = { create = local.data_reader, namespace = var.data_reader.namespace, service_account = var.data_reader.service_account }
    training    = { create = local.training_identity, namespace = var.training_identity.namespace, service_account = var.training_identity.service_account }
  }
}

data "aws_iam_policy_document" "pod_identity_assume" {
  for_each = { for name, identity in local.pod_identities : name => identity if identity.create }

  statement {
    actions = ["sts:AssumeRole", "sts:TagSession"]
    principals {
      type        = "Service"
      identifiers = ["pods.eks.amazonaws.com"]
    }
    # Confused deputy: only EKS acting for this account (IAM User Guide, "The confused deputy problem"; the EKS Best
    # Practices Guide's Pod Identity trust policy, Security > IAM, checks aws:SourceOrgId, the same check by
    # organisation, which an account outside AWS Organizations lacks).
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }
    # And only for this service account of this cluster, from the session tags Pod Identity sends (EKS User Guide,
    # "Create IAM role with trust policy required by EKS Pod Identity", Setting Conditions).
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/eks-cluster-arn"
      values   = [aws_eks_cluster.this[0].arn]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/kubernetes-namespace"
      values   = [each.value.namespace]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/kubernetes-service-account"
      values   = [each.value.service_account]
    }
  }
}

data "aws_iam_policy_document" "fsx_csi" {
  # The file system is created by Terraform and attached as a static PersistentVolume, so the CSI
  # controller only needs to read file systems and update the ones in this account (resize, tags);
  # no CreateFileSystem/DeleteFileSystem and no IAM rights.
  statement {
    actions   = ["fsx:DescribeFileSystems"]
    resources = ["*"] # a list action: it cannot be scoped to a resource ARN
  }
  statement {
    actions   = ["fsx:UpdateFileSystem", "fsx:TagResource", "fsx:ListTagsForResource"]
    resources = ["arn:${local.partition}:fsx:*:${data.aws_caller_identity.current.account_id}:file-system/*"]

    # Only this stack's file system: the one carrying its tag (its ARN is not known here, the file
    # system being created after the cluster).
    dynamic "condition" {
      for_each = var.fsx_scope_tag == null ? [] : [var.fsx_scope_tag]
      content {
        test     = "StringEquals"
        variable = "aws:ResourceTag/${condition.value.key}"
        values   = [condition.value.value]
      }
    }
  }
}

# The VPC CNI's own role: the AWS managed policy for an IPv4 cluster (EKS User Guide, "Configure Amazon VPC CNI plugin
# to use IRSA": AmazonEKS_CNI_Policy, attached to "a separate IAM role", which it recommends over the node role).
resource "aws_iam_role" "vpc_cni" {
  count = local.vpc_cni_pod_identity ? 1 : 0

  name_prefix        = "${substr(var.name, 0, 24)}-vpc-cni-"
  assume_role_policy = data.aws_iam_policy_document.pod_identity_assume["vpc_cni"].json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "vpc_cni" {
  count = local.vpc_cni_pod_identity ? 1 : 0

  role       = aws_iam_role.vpc_cni[0].name
  policy_arn = "${local.policy}/AmazonEKS_CNI_Policy"
}

resource "aws_iam_role" "fsx_csi" {
  count = local.create && var.enable_pod_identity ? 1 : 0

  name_prefix        = "${substr(var.name, 0, 24)}-fsx-csi-"
  assume_role_policy = data.aws_iam_policy_document.pod_identity_assume["fsx_csi"].json
  tags               = var.tags
}

resource "aws_iam_role_policy" "fsx_csi" {
  count = local.create && var.enable_pod_identity ? 1 : 0

  role   = aws_iam_role.fsx_csi[0].id
  policy = data.aws_iam_policy_document.fsx_csi.json
}

resource "aws_eks_pod_identity_association" "fsx_csi" {
  count = local.create && var.enable_pod_identity ? 1 : 0

  cluster_name    = aws_eks_cluster.this[0].name
  namespace       = local.pod_identities.fsx_csi.namespace
  service_account = local.pod_identities.fsx_csi.service_account
  role_arn        = aws_iam_role.fsx_csi[0].arn
  tags            = var.tags
}

# The EBS CSI controller (the aws-ebs-csi-driver add-on's ebs-csi-controller-sa) creates, attaches and deletes the
# platform etcd's volume: AWS's managed policy for it, and the stack's key for the volume's encryption, which EBS
# uses through grants (EKS User Guide, "Use Kubernetes volume storage with Amazon EBS": AmazonEBSCSIDriverPolicy, and
# for a customer managed key, CreateGrant, ListGrants and RevokeGrant only for AWS resources, plus the data-key
# actions).
locals {
  ebs_csi = local.create && var.enable_pod_identity && contains(keys(local.addons), "aws-ebs-csi-driver")
}

data "aws_iam_policy_document" "ebs_csi_kms" {
  statement {
    actions   = ["kms:CreateGrant", "kms:ListGrants", "kms:RevokeGrant"]
    resources = [var.kms_key_arn]
    condition {
      test     = "Bool"
      variable = "kms:GrantIsForAWSResource"
      values   = ["true"]
    }
  }
  statement {
    actions   = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"]
    resources = [var.kms_key_arn]
  }
}

resource "aws_iam_role" "ebs_csi" {
  count = local.ebs_csi ? 1 : 0

  name_prefix        = "${substr(var.name, 0, 24)}-ebs-csi-"
  assume_role_policy = data.aws_iam_policy_document.pod_identity_assume["ebs_csi"].json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "ebs_csi" {
  count = local.ebs_csi ? 1 : 0

  role       = aws_iam_role.ebs_csi[0].name
  policy_arn = "${local.policy}/service-role/AmazonEBSCSIDriverPolicy"
}

resource "aws_iam_role_policy" "ebs_csi_kms" {
  count = local.ebs_csi ? 1 : 0

  role   = aws_iam_role.ebs_csi[0].id
  policy = data.aws_iam_policy_document.ebs_csi_kms.json
}

resource "aws_eks_pod_identity_association" "ebs_csi" {
  count = local.ebs_csi ? 1 : 0

  cluster_name    = aws_eks_cluster.this[0].name
  namespace       = local.pod_identities.ebs_csi.namespace
  service_account = local.pod_identities.ebs_csi.service_account
  role_arn        = aws_iam_role.ebs_csi[0].arn
  tags            = var.tags
}

# The data-preparation job (invoke data.imagenet --target eks) copies from S3 onto FSx: list and read the
# named buckets, nothing else. Its pod runs as data_reader.service_account (the platform stack creates it); the
# Pod Identity agent add-on hands it this role's credentials through its own projected token.
locals {
  data_reader             = local.create && var.enable_pod_identity && length(var.data_reader.buckets) > 0
  data_reader_bucket_arns = [for bucket in var.data_reader.buckets : "arn:${local.partition}:s3:::${bucket}"]
}

data "aws_iam_policy_document" "data_reader" {
  count = local.data_reader ? 1 : 0

  statement {
    actions   = ["s3:ListBucket"]
    resources = local.data_reader_bucket_arns
  }
  statement {
    actions   = ["s3:GetObject"]
    resources = [for arn in local.data_reader_bucket_arns : "${arn}/*"]
  }
}

resource "aws_iam_role" "data_reader" {
  count = local.data_reader ? 1 : 0

  name_prefix        = "${substr(var.name, 0, 24)}-data-"
  assume_role_policy = data.aws_iam_policy_document.pod_identity_assume["data_reader"].json
  tags               = var.tags
}

resource "aws_iam_role_policy" "data_reader" {
  count = local.data_reader ? 1 : 0

  role   = aws_iam_role.data_reader[0].id
  policy = data.aws_iam_policy_document.data_reader[0].json
}

resource "aws_eks_pod_identity_association" "data_reader" {
  count = local.data_reader ? 1 : 0

  cluster_name    = aws_eks_cluster.this[0].name
  namespace       = local.pod_identities.data_reader.namespace
  service_account = local.pod_identities.data_reader.service_account
  role_arn        = aws_iam_role.data_reader[0].arn
  tags            = var.tags
}

# The training pods' credentials: what they reach with AWS credentials (the stack's SageMaker managed MLflow tracking
# server, whose requests the sagemaker-mlflow plugin signs with them). Their pods run as training_identity's service
# account (the platform stack creates it; the launcher names it in a job that logs to such a server); the Pod Identity
# agent add-on hands them this role's credentials through its own projected token, so no Kubernetes API token is
# mounted.
locals {
  training_identity = local.create && var.enable_pod_identity && var.training_identity.enabled
}

resource "aws_iam_role" "training" {
  count = local.training_identity ? 1 : 0

  name_prefix        = "${substr(var.name, 0, 24)}-training-"
  assume_role_policy = data.aws_iam_policy_document.pod_identity_assume["training"].json
  tags               = var.tags
}

resource "aws_iam_role_policy" "training" {
  count = local.training_identity ? 1 : 0

  name   = "trainkit-mlflow-client"
  role   = aws_iam_role.training[0].id
  policy = var.training_identity.policy_json
}

resource "aws_eks_pod_identity_association" "training" {
  count = local.training_identity ? 1 : 0

  cluster_name    = aws_eks_cluster.this[0].name
  namespace       = local.pod_identities.training.namespace
  service_account = local.pod_identities.training.service_account
  role_arn        = aws_iam_role.training[0].arn
  tags            = var.tags
}
