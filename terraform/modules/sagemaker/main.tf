################################################################################
# SageMaker Training (opt-in): the execution role, the runs bucket and the security group that lets one job's
# instances reach each other. The Hugging Face token's secret is the infra stack's (shared with AWS Batch; its
# value is put by `invoke secrets.hf-token`, never by Terraform, so it is never in the state): the role reads it,
# and likewise a self-hosted MLflow tracking server's bearer token (`invoke secrets.mlflow-token`).
#
# Bucket layout (trainkit/backends/sagemaker/request.py):
#   runs/<run-id>/launch/<job>/   spec.json, workload.json, a script's code (the job's `trainkit` channel)
#   runs/<run-id>/output/         model.tar.gz (OutputDataConfig)
#   checkpoints/<run-id>/         CheckpointConfig.S3Uri; expires after checkpoint_retention_days
################################################################################

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  account     = data.aws_caller_identity.current.account_id
  partition   = data.aws_partition.current.partition
  region      = data.aws_region.current.name
  bucket_arn  = "arn:${local.partition}:s3:::${var.name}-runs-${local.account}"
  data_arns   = [for bucket in var.data_source_buckets : "arn:${local.partition}:s3:::${bucket}"]
  log_group   = "arn:${local.partition}:logs:${local.region}:${local.account}:log-group:/aws/sagemaker/TrainingJobs"
  subnet_arns = [for id in var.subnet_ids : "arn:${local.partition}:ec2:${local.region}:${local.account}:subnet/${id}"]
  # The secrets the role reads: the Hugging Face token and a self-hosted MLflow server's bearer token (null: none).
  token_secret_arns = compact([var.hf_token_secret_arn, var.mlflow_token_secret_arn])
}

################################################################################
# The runs bucket: encrypted with the stack's key, never public, TLS only
################################################################################

resource "aws_s3_bucket" "runs" {
  count = var.create ? 1 : 0
  #checkov:skip=CKV_AWS_18:access logs of a scratch bucket for runs; CloudTrail data events cover auditing where wanted
  #checkov:skip=CKV_AWS_144:runs and checkpoints are rebuilt by training; no second region
  #checkov:skip=CKV2_AWS_62:nothing consumes the bucket's events

  bucket        = "${var.name}-runs-${local.account}"
  force_destroy = var.force_destroy
}

resource "aws_s3_bucket_versioning" "runs" {
  count = var.create ? 1 : 0

  bucket = aws_s3_bucket.runs[0].id
  versioning_configuration {
    status = "Enabled" # an object overwritten mid-sync can be recovered; old versions expire below
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "runs" {
  count = var.create ? 1 : 0

  bucket = aws_s3_bucket.runs[0].id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_public_access_block" "runs" {
  count = var.create ? 1 : 0

  bucket                  = aws_s3_bucket.runs[0].id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_lifecycle_configuration" "runs" {
  count = var.create ? 1 : 0

  bucket = aws_s3_bucket.runs[0].id
  rule {
    id     = "expire-old-checkpoints"
    status = "Enabled"
    filter {
      prefix = "checkpoints/"
    }
    expiration {
      days = var.checkpoint_retention_days
    }
  }
  rule {
    id     = "expire-old-versions-and-uploads"
    status = "Enabled"
    filter {}
    noncurrent_version_expiration {
      noncurrent_days = 7
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

data "aws_iam_policy_document" "tls_only" {
  statement {
    sid       = "DenyPlainHttp"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [local.bucket_arn, "${local.bucket_arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "runs" {
  count = var.create ? 1 : 0

  bucket     = aws_s3_bucket.runs[0].id
  policy     = data.aws_iam_policy_document.tls_only.json
  depends_on = [aws_s3_bucket_public_access_block.runs]
}

################################################################################
# The instances of one job reach each other (torchrun, NCCL; EFA needs all traffic from the group itself)
################################################################################

resource "aws_security_group" "training" {
  count = var.create ? 1 : 0
  #checkov:skip=CKV2_AWS_5:attached by SageMaker to each job's instances (the request's VpcConfig), not by Terraform

  name_prefix = "${var.name}-sagemaker-"
  description = "trainkit SageMaker training instances"
  vpc_id      = var.vpc_id

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "training_self" {
  count = var.create ? 1 : 0

  security_group_id            = aws_security_group.training[0].id
  referenced_security_group_id = aws_security_group.training[0].id
  ip_protocol                  = "-1"
  description                  = "All traffic from the job's other instances (torchrun, NCCL, EFA)"
}

resource "aws_vpc_security_group_egress_rule" "training_self" {
  count = var.create ? 1 : 0

  security_group_id            = aws_security_group.training[0].id
  referenced_security_group_id = aws_security_group.training[0].id
  ip_protocol                  = "-1"
  description                  = "All traffic to the job's other instances (torchrun, NCCL, EFA)"
}

resource "aws_vpc_security_group_egress_rule" "training_https" {
  count = var.create ? 1 : 0

  security_group_id = aws_security_group.training[0].id
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  description       = "HTTPS to S3, ECR, CloudWatch Logs and Secrets Manager (through the NAT or endpoints)"
}

################################################################################
# The execution role: what a job may read and write, nothing else
################################################################################

data "aws_iam_policy_document" "trust" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["sagemaker.amazonaws.com"]
    }
    # Confused deputy: only SageMaker acting for this account (SageMaker Developer Guide, "Cross-service
    # confused deputy prevention").
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account]
    }
  }
}

resource "aws_iam_role" "training" {
  count = var.create ? 1 : 0

  name_prefix        = "${var.name}-sagemaker-"
  assume_role_policy = data.aws_iam_policy_document.trust.json
}

data "aws_iam_policy_document" "training" {
  # The run's files: list and read runs/ and checkpoints/, write outputs and checkpoints. datasets/ is where a
  # job's data may live in this bucket without naming another one (read only).
  statement {
    sid       = "ListRuns"
    actions   = ["s3:ListBucket"]
    resources = [local.bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["runs/*", "checkpoints/*", "datasets/*"]
    }
  }
  statement {
    sid       = "ReadRuns"
    actions   = ["s3:GetObject"]
    resources = ["${local.bucket_arn}/runs/*", "${local.bucket_arn}/checkpoints/*", "${local.bucket_arn}/datasets/*"]
  }
  statement {
    sid       = "WriteOutputsAndCheckpoints"
    actions   = ["s3:PutObject", "s3:AbortMultipartUpload"]
    resources = ["${local.bucket_arn}/runs/*/output/*", "${local.bucket_arn}/checkpoints/*"]
  }
  statement {
    sid       = "PruneCheckpoints"
    actions   = ["s3:DeleteObject"]
    resources = ["${local.bucket_arn}/checkpoints/*"]
  }
  dynamic "statement" {
    for_each = length(local.data_arns) > 0 ? [1] : []
    content {
      sid       = "ReadDatasets"
      actions   = ["s3:ListBucket", "s3:GetObject"]
      resources = concat(local.data_arns, [for arn in local.data_arns : "${arn}/*"])
    }
  }
  # The stack's key, only as S3 and Secrets Manager use it for the role (kms:ViaService, AWS KMS Developer Guide,
  # "kms:ViaService"): the runs bucket's objects and the job's output (OutputDataConfig.KmsKeyId: the role "must
  # include permissions to call kms:Encrypt", SageMaker API Reference, OutputDataConfig), and the tokens' secrets.
  statement {
    sid       = "UseTheStackKeyThroughS3"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey", "kms:Encrypt"]
    resources = [var.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${local.region}.amazonaws.com"]
    }
  }
  # The tokens' secrets (the Hugging Face token, a self-hosted MLflow server's bearer token): exactly these, one
  # statement for all of them.
  dynamic "statement" {
    for_each = length(local.token_secret_arns) > 0 ? [1] : []
    content {
      sid       = "ReadTheToken"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = local.token_secret_arns
    }
  }
  dynamic "statement" {
    for_each = length(local.token_secret_arns) > 0 ? [1] : []
    content {
      sid       = "DecryptTheToken"
      actions   = ["kms:Decrypt"]
      resources = [var.kms_key_arn]
      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["secretsmanager.${local.region}.amazonaws.com"]
      }
    }
  }
  # The training image, from this stack's repositories only.
  statement {
    sid       = "PullTheImage"
    actions   = ["ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage"]
    resources = var.image_repository_arns
  }
  statement {
    sid       = "EcrLogin"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"] # the action has no resource type (Service Authorization Reference, Amazon ECR)
  }
  # Its logs and metrics.
  statement {
    sid       = "WriteLogs"
    actions   = ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]
    resources = [local.log_group, "${local.log_group}:*"]
  }
  statement {
    sid       = "WriteMetrics"
    actions   = ["cloudwatch:PutMetricData"]
    resources = ["*"] # the action has no resource type; the namespace bounds it
    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = ["/aws/sagemaker/TrainingJobs"]
    }
  }
  # VpcConfig: SageMaker attaches the instances' network interfaces in the stack's subnets with this role (Developer
  # Guide, "Give SageMaker AI Training Jobs Access to Resources in Your Amazon VPC"; the CreateTrainingJob execution
  # role's EC2 actions, "How to use SageMaker AI execution roles"). Scoped per the Service Authorization Reference,
  # Amazon EC2 (https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html):
  # CreateNetworkInterface authorizes the new interface (no ec2:Subnet key on it, and no ARN yet), the subnet
  # (required) and the security groups, so naming the subnets and the group bounds where interfaces are made; the
  # other three act on an existing interface, whose ec2:Subnet (an ARN) must be one of the stack's subnets.
  statement {
    sid     = "CreateInterfacesInTheSubnets"
    actions = ["ec2:CreateNetworkInterface"]
    resources = concat(
      local.subnet_arns,
      ["arn:${local.partition}:ec2:${local.region}:${local.account}:network-interface/*"],
      var.create ? [aws_security_group.training[0].arn] : [],
    )
  }
  statement {
    sid       = "ManageInterfacesInTheSubnets"
    actions   = ["ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface"]
    resources = ["arn:${local.partition}:ec2:${local.region}:${local.account}:network-interface/*"]
    condition {
      test     = "ArnEquals"
      variable = "ec2:Subnet"
      values   = local.subnet_arns
    }
  }
  # DeleteNetworkInterfacePermission names a permission, not an interface: the reference lists the interface as an
  # optional resource of it, with ec2:Subnet. Where EC2 evaluates the interface the subnet must be the stack's; a
  # strict condition could leave SageMaker unable to remove its own permissions if it ever did not.
  statement {
    sid       = "RemoveInterfacePermissionsInTheSubnets"
    actions   = ["ec2:DeleteNetworkInterfacePermission"]
    resources = ["arn:${local.partition}:ec2:${local.region}:${local.account}:network-interface/*"]
    condition {
      test     = "ArnEqualsIfExists"
      variable = "ec2:Subnet"
      values   = local.subnet_arns
    }
  }
  statement {
    sid = "DescribeTheVpc"
    actions = [
      "ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs", "ec2:DescribeDhcpOptions", "ec2:DescribeSubnets",
      "ec2:DescribeSecurityGroups",
    ]
    resources = ["*"] # Describe actions have no resource types
  }
}

resource "aws_iam_role_policy" "training" {
  count = var.create ? 1 : 0

  name   = "trainkit-training"
  role   = aws_iam_role.training[0].id
  policy = data.aws_iam_policy_document.training.json
}

################################################################################
# Experiment tracking: the execution role logs to the stack's managed MLflow tracking server
################################################################################

resource "aws_iam_role_policy" "mlflow" {
  count = var.create && var.mlflow_enabled ? 1 : 0

  name   = "trainkit-mlflow-client"
  role   = aws_iam_role.training[0].id
  policy = var.mlflow_client_policy_json
}
