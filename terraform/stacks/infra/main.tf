################################################################################
# Infra stack: network, KMS, EKS, GPU node groups, FSx for Lustre, ECR; opt-in SageMaker and AWS Batch parts
# (hashicorp/aws only)
################################################################################

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

data "aws_availability_zones" "region" {
  # The AZs the stack names, looked up by name: one the region does not have is simply not returned
  # (the precondition below names it).
  state = "available"
  filter {
    name   = "zone-name"
    values = var.availability_zones
  }
}

locals {
  tags = merge(var.extra_tags, {
    project             = "trainkit"
    stack               = "infra"
    owner               = var.owner
    "trainkit:stack-id" = var.stack_id
  })
  account   = data.aws_caller_identity.current.account_id
  partition = data.aws_partition.current.partition

  batch_instance_types = coalesce(var.batch_instance_types, [var.gpu_instance_type])
  idle_guard           = var.idle_guard_minutes != null && var.enable_pod_identity
}

################################################################################
# Auto Scaling's service-linked role, which the key policy below names
################################################################################

# KMS refuses a key policy whose principal does not exist ("MalformedPolicyDocumentException: Policy contains a
# statement with one or more invalid principals"), and an account that has never had an Auto Scaling group has no
# AWSServiceRoleForAutoScaling. IAM refuses to create it a second time ("has been taken in this account"), so it is
# looked up: created when missing, and kept while it is the one this stack made (default_tags give it the
# stack id).
data "aws_iam_roles" "autoscaling" {
  name_regex  = "^AWSServiceRoleForAutoScaling$"
  path_prefix = "/aws-service-role/autoscaling.amazonaws.com/"
}

data "aws_iam_role" "autoscaling" {
  for_each = data.aws_iam_roles.autoscaling.names

  name = each.value
}

locals {
  autoscaling_role_is_ours = anytrue([for role in data.aws_iam_role.autoscaling : try(role.tags["trainkit:stack-id"], null) == var.stack_id])
}

resource "aws_iam_service_linked_role" "autoscaling" {
  count = length(data.aws_iam_roles.autoscaling.names) == 0 || local.autoscaling_role_is_ours ? 1 : 0

  aws_service_name = "autoscaling.amazonaws.com"
  description      = "Made by trainkit stack ${var.stack_id}: its KMS key policy names this role; the stack's destroy deletes it"
}

################################################################################
# KMS: one key for Kubernetes secrets, logs, EBS root volumes, FSx and ECR
################################################################################

data "aws_iam_policy_document" "kms" {
  # A key policy's Resource "*" means "this key"; access is limited by the principals and conditions.
  #checkov:skip=CKV_AWS_109:key policy, resource is the key itself
  #checkov:skip=CKV_AWS_111:key policy, resource is the key itself
  #checkov:skip=CKV_AWS_356:key policy, resource is the key itself
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account}:root"]
    }
  }

  statement {
    sid       = "CloudWatchLogsEncrypt"
    actions   = ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]
    resources = ["*"]
    principals {
      type        = "Service"
      identifiers = ["logs.${var.region}.amazonaws.com"]
    }
    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${local.partition}:logs:${var.region}:${local.account}:*"]
    }
  }

  # Managed node groups launch through Auto Scaling, whose service-linked role must use the key
  # for the encrypted root volumes (EC2 user guide, "Required KMS key policy for use with encrypted volumes").
  statement {
    sid       = "AutoScalingUsesKeyForVolumes"
    actions   = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account}:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"]
    }
  }

  statement {
    sid       = "AutoScalingGrantsForVolumes"
    actions   = ["kms:CreateGrant"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account}:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"]
    }
    condition {
      test     = "Bool"
      variable = "kms:GrantIsForAWSResource"
      values   = ["true"]
    }
  }
}

resource "aws_kms_key" "this" {
  description             = "trainkit ${var.name}: EKS secrets, logs, volumes, FSx, ECR"
  enable_key_rotation     = true
  deletion_window_in_days = 7
  policy                  = data.aws_iam_policy_document.kms.json

  depends_on = [aws_iam_service_linked_role.autoscaling] # its principal must exist first
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}"
  target_key_id = aws_kms_key.this.key_id
}

################################################################################
# Modules
################################################################################

module "network" {
  source = "../../modules/network"

  name        = var.name
  azs         = var.availability_zones
  gpu_az      = var.gpu_availability_zone
  kms_key_arn = aws_kms_key.this.arn
}

module "eks" {
  source = "../../modules/eks"

  name                     = var.name
  kubernetes_version       = var.kubernetes_version
  vpc_id                   = module.network.vpc_id
  subnet_ids               = module.network.private_subnet_ids
  kms_key_arn              = aws_kms_key.this.arn
  endpoint_public_access   = var.endpoint_public_access
  public_access_cidrs      = var.public_access_cidrs
  admin_principal_arns     = var.admin_principal_arns
  submitter_principal_arns = var.submitter_principal_arns
  enable_addons            = var.enable_eks_addons
  enable_access_entries    = var.enable_access_entries
  enable_pod_identity      = var.enable_pod_identity
  fsx_scope_tag            = { key = "trainkit:stack-id", value = var.stack_id } # FSx carries it (default_tags)
  data_reader              = { buckets = var.data_source_buckets }
  training_identity        = { enabled = var.mlflow_enabled, policy_json = module.mlflow.client_policy_json }
  tags                     = local.tags # the system nodes' instances, volumes and interfaces: default_tags do not reach them
}

module "gpu_nodegroup" {
  source = "../../modules/gpu-nodegroup"

  cluster_name              = module.eks.cluster_name
  node_role_arn             = module.eks.node_role_arn
  vpc_id                    = module.network.vpc_id
  subnet_id                 = module.network.gpu_subnet_id
  cluster_security_group_id = module.eks.cluster_security_group_id
  kms_key_arn               = aws_kms_key.this.arn
  enable_placement_group    = var.enable_placement_group

  idle_guard = local.idle_guard ? {} : null
  tags       = local.tags # the GPU nodes' instances, volumes and EFA interfaces: default_tags do not reach them

  node_groups = {
    gpu = {
      instance_type           = var.gpu_instance_type
      min_size                = var.gpu_min_nodes
      desired_size            = var.gpu_desired_nodes
      max_size                = var.gpu_max_nodes
      market                  = var.gpu_market
      capacity_reservation_id = var.gpu_capacity_reservation_id
      placement_group_name    = var.gpu_placement_group_name
    }
  }
}

locals {
  # Each private subnet (the system nodes) as one Lustre NID range, which FSx's root squash spares: the octets its
  # prefix fixes, then the range of the octet it fixes in part, then [0-255] (10.0.64.0/20: 10.0.[64-79].[0-255]@tcp;
  # the range syntax of the FSx API Reference, LustreRootSquashConfiguration.NoSquashNids).
  system_node_nids = [
    for cidr in module.network.private_subnet_cidrs : "${join(".", [
      for i in range(4) : split(".", cidrhost(cidr, 0))[i] == split(".", cidrhost(cidr, -1))[i]
      ? split(".", cidrhost(cidr, 0))[i]
      : "[${split(".", cidrhost(cidr, 0))[i]}-${split(".", cidrhost(cidr, -1))[i]}]"
    ])}@tcp"
  ]
}

module "fsx_lustre" {
  source = "../../modules/fsx-lustre"

  create                    = var.enable_fsx
  name                      = var.name
  vpc_id                    = module.network.vpc_id
  subnet_id                 = module.network.gpu_subnet_id
  client_security_group_ids = [module.eks.cluster_security_group_id, module.gpu_nodegroup.efa_security_group_id]
  storage_capacity_gib      = var.fsx_storage_capacity_gib
  throughput_per_tib        = var.fsx_throughput_per_tib
  kms_key_arn               = aws_kms_key.this.arn
  s3_import_path            = var.fsx_s3_import_path
  sync_deletions            = var.fsx_sync_deletions
  root_squash               = var.fsx_root_squash ? { uid_gid = "65534:65534", no_squash_nids = local.system_node_nids } : null
}

module "ecr" {
  source = "../../modules/ecr"

  name_prefix = var.name
  # The platform's own image (the idle guard's CronJob and the etcd issuer, which every etcd job needs, guard or not)
  # gets a repository of its own: the lifecycle policy's "keep the newest N" counts per repository, so pushes of
  # training images never expire the image the platform runs.
  repositories = ["train", "data-prep", "idle-guard"]
  kms_key_arn  = aws_kms_key.this.arn
}

module "sagemaker" {
  source = "../../modules/sagemaker"

  create                    = var.sagemaker_enabled
  name                      = var.name
  vpc_id                    = module.network.vpc_id
  subnet_ids                = [module.network.gpu_subnet_id] # the GPU subnet: one AZ, where the capacity is
  kms_key_arn               = aws_kms_key.this.arn
  image_repository_arns     = values(module.ecr.repository_arns)
  hf_token_secret_arn       = try(aws_secretsmanager_secret.job_token["hf-token"].arn, null)
  mlflow_token_secret_arn   = try(aws_secretsmanager_secret.job_token["mlflow-token"].arn, null)
  data_source_buckets       = var.data_source_buckets
  checkpoint_retention_days = var.sagemaker_checkpoint_retention_days

  inter_container_traffic_encryption = var.sagemaker_inter_container_traffic_encryption

  mlflow_enabled            = var.mlflow_enabled
  mlflow_client_policy_json = module.mlflow.client_policy_json
}

module "batch" {
  source = "../../modules/batch"

  create    = var.batch_enabled
  name      = var.name
  vpc_id    = module.network.vpc_id
  subnet_id = module.network.gpu_subnet_id # the GPU subnet: the AZ of the GPU capacity and of FSx for Lustre
  # The gpu-nodegroup module's instance table and EFA layout, one source for both ways of running GPU nodes.
  instance_types = [for type in local.batch_instance_types : {
    name               = type
    vcpus              = module.gpu_nodegroup.instance_types[type].vcpus
    network_interfaces = module.gpu_nodegroup.efa_interfaces[type]
  }]
  max_nodes               = var.batch_max_nodes
  capacity_wait_minutes   = var.batch_capacity_wait_minutes
  ami_id                  = var.batch_ami_id
  enable_placement_group  = var.enable_placement_group
  kms_key_arn             = aws_kms_key.this.arn
  image_repository_arns   = values(module.ecr.repository_arns)
  hf_token_secret_arn     = try(aws_secretsmanager_secret.job_token["hf-token"].arn, null)
  mlflow_token_secret_arn = try(aws_secretsmanager_secret.job_token["mlflow-token"].arn, null)
  data_source_buckets     = var.data_source_buckets
  fsx = var.enable_fsx ? {
    dns_name          = module.fsx_lustre.dns_name
    mount_name        = module.fsx_lustre.mount_name
    security_group_id = module.fsx_lustre.security_group_id
    ports             = module.fsx_lustre.lustre_ports
  } : null
  tags = local.tags # Batch's instances, volumes and interfaces: default_tags do not reach them

  mlflow_enabled            = var.mlflow_enabled
  mlflow_client_policy_json = module.mlflow.client_policy_json
}

module "mlflow" {
  source = "../../modules/mlflow"

  create               = var.mlflow_enabled
  name                 = var.name
  kms_key_arn          = aws_kms_key.this.arn
  tracking_server_size = var.mlflow_tracking_server_size
}

################################################################################
# The tokens of SageMaker and Batch jobs, a secret each, one for both targets: created empty, filled by
# `invoke secrets.hf-token` / `invoke secrets.mlflow-token` (PutSecretValue), so their values are never in the state.
# The Hugging Face token; the bearer token of a self-hosted MLflow tracking server (MLflow's client reads
# MLFLOW_TRACKING_TOKEN). A SageMaker managed tracking server (mlflow_enabled) needs none: its requests are signed
# with the job's IAM role.
################################################################################

locals {
  # The secret's name prefix (after the stack's name) => its description.
  job_tokens = var.sagemaker_enabled || var.batch_enabled ? {
    "hf-token"     = "Hugging Face token of trainkit's SageMaker and Batch jobs (their execution roles read it)"
    "mlflow-token" = "Bearer token of a self-hosted MLflow tracking server for trainkit's SageMaker and Batch jobs (their execution roles read it), filled by `invoke secrets.mlflow-token`; a SageMaker managed tracking server needs none: its requests are signed with the job's IAM role"
  } : {}
}

resource "aws_secretsmanager_secret" "job_token" {
  for_each = local.job_tokens
  #checkov:skip=CKV2_AWS_57:the tokens are issued by Hugging Face and by the MLflow tracking server's operator; AWS cannot rotate them

  name_prefix             = "${var.name}-${each.key}-"
  description             = each.value
  kms_key_id              = aws_kms_key.this.arn
  recovery_window_in_days = 0 # `make down` leaves nothing, not a secret pending deletion
}

# The Hugging Face token's secret used to be the SageMaker module's, then this stack's own resource; the MLflow
# token's had one of its own too. A stack made then keeps its secrets (and the values put in them): Terraform
# follows the chain of moves.
moved {
  from = module.sagemaker.aws_secretsmanager_secret.hf_token[0]
  to   = aws_secretsmanager_secret.hf_token[0]
}

moved {
  from = aws_secretsmanager_secret.hf_token[0]
  to   = aws_secretsmanager_secret.job_token["hf-token"]
}

moved {
  from = aws_secretsmanager_secret.mlflow_token[0]
  to   = aws_secretsmanager_secret.job_token["mlflow-token"]
}

# A plan-time error, not a warning: an AZ name the region does not have (us-east-1z, us-east-12a) would
# otherwise fail halfway through an apply, with part of the stack created.
resource "terraform_data" "availability_zones_exist" {
  input = var.availability_zones

  lifecycle {
    precondition {
      condition     = length(setsubtract(var.availability_zones, data.aws_availability_zones.region.names)) == 0
      error_message = "availability_zones: ${join(", ", setsubtract(var.availability_zones, data.aws_availability_zones.region.names))} not available in ${var.region} for this account; name AZs the region has (aws ec2 describe-availability-zones --region ${var.region})."
    }
  }
}
