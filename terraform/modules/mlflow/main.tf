################################################################################
# SageMaker managed MLflow (opt-in): the tracking server `--track mlflow` logs to on AWS when no --tracking-uri is
# given, its artifact bucket and the role it stores artifacts with; and the policy a job's role needs to log to it
# (client_policy_json: the SageMaker execution role and the Batch job role get it).
#
# Requests to the server are signed with the job role's credentials (SigV4, service sagemaker-mlflow: the
# sagemaker-mlflow plugin, sagemaker_mlflow/auth_provider.py) and go to https://<region>.experiments.sagemaker.aws
# through the NAT (port 443, which the jobs' security groups allow out). Artifacts (a run's summary and report) go
# straight to the artifact bucket with the same credentials (MLflow's S3 artifact repository, which the plugin
# registers as sagemaker_mlflow.s3_presigned_artifact_repo without changing it unless asked).
################################################################################

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  account     = data.aws_caller_identity.current.account_id
  partition   = data.aws_partition.current.partition
  region      = data.aws_region.current.name
  server_name = "${var.name}-mlflow"
  server_arn  = "arn:${local.partition}:sagemaker:${local.region}:${local.account}:mlflow-tracking-server/${local.server_name}"
  bucket_arn  = "arn:${local.partition}:s3:::${var.name}-mlflow-${local.account}"
}

################################################################################
# The artifact bucket: encrypted with the stack's key, never public, TLS only
################################################################################

resource "aws_s3_bucket" "artifacts" {
  count = var.create ? 1 : 0
  #checkov:skip=CKV_AWS_18:access logs of the runs' artifacts bucket; CloudTrail data events cover auditing where wanted
  #checkov:skip=CKV_AWS_144:artifacts of experiments (summaries, reports); no second region
  #checkov:skip=CKV2_AWS_62:nothing consumes the bucket's events
  #checkov:skip=CKV2_AWS_61:the artifacts are the record of the experiments: kept until the stack goes

  bucket        = "${var.name}-mlflow-${local.account}"
  force_destroy = var.force_destroy
}

resource "aws_s3_bucket_versioning" "artifacts" {
  count = var.create ? 1 : 0

  bucket = aws_s3_bucket.artifacts[0].id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "artifacts" {
  count = var.create ? 1 : 0

  bucket = aws_s3_bucket.artifacts[0].id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_public_access_block" "artifacts" {
  count = var.create ? 1 : 0

  bucket                  = aws_s3_bucket.artifacts[0].id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
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

resource "aws_s3_bucket_policy" "artifacts" {
  count = var.create ? 1 : 0

  bucket     = aws_s3_bucket.artifacts[0].id
  policy     = data.aws_iam_policy_document.tls_only.json
  depends_on = [aws_s3_bucket_public_access_block.artifacts]
}

################################################################################
# The tracking server and the role it stores artifacts with
################################################################################

# SageMaker Developer Guide, "Set up IAM permissions for MLflow": the server's role trusts sagemaker.amazonaws.com
# and may read and write the artifact store; the model-registry actions it also lists are for automatic model
# registration, which this server does not do.
data "aws_iam_policy_document" "server_trust" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["sagemaker.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account]
    }
  }
}

resource "aws_iam_role" "server" {
  count = var.create ? 1 : 0

  name_prefix        = "${var.name}-mlflow-"
  assume_role_policy = data.aws_iam_policy_document.server_trust.json
}

# The artifact bucket's key, only as S3 uses it (kms:ViaService, AWS KMS Developer Guide): the same statement for
# the server's role (sid ArtifactStoreKey) and a job's role (sid ArtifactsKey, in the client policy).
data "aws_iam_policy_document" "artifacts_key" {
  for_each = toset(["ArtifactStoreKey", "ArtifactsKey"])

  statement {
    sid       = each.key
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${local.region}.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "server" {
  statement {
    sid       = "ArtifactStore"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket", "s3:GetBucketLocation"]
    resources = [local.bucket_arn, "${local.bucket_arn}/*"]
  }

  # ArtifactStoreKey, last, as before: no statement here has its sid, so it overrides nothing.
  override_policy_documents = [data.aws_iam_policy_document.artifacts_key["ArtifactStoreKey"].json]
}

resource "aws_iam_role_policy" "server" {
  count = var.create ? 1 : 0

  name   = "trainkit-mlflow-server"
  role   = aws_iam_role.server[0].id
  policy = data.aws_iam_policy_document.server.json
}

resource "aws_sagemaker_mlflow_tracking_server" "this" {
  count = var.create ? 1 : 0

  tracking_server_name         = local.server_name
  artifact_store_uri           = "s3://${aws_s3_bucket.artifacts[0].bucket}/"
  role_arn                     = aws_iam_role.server[0].arn
  tracking_server_size         = var.tracking_server_size
  mlflow_version               = var.mlflow_version
  automatic_model_registration = false

  depends_on = [aws_iam_role_policy.server]
}

################################################################################
# What a job's role needs to log to it
################################################################################

# The actions of "Amazon SageMaker with MLflow" (Service Authorization Reference, service prefix sagemaker-mlflow)
# that trainkit's client calls: the experiment (GetExperimentByName, CreateExperiment), the run (SearchRuns by its
# trainkit.run_id tag, CreateRun, GetRun, UpdateRun for its state), what it logs (LogBatch: parameters and metrics,
# SetTag), the history a restart reads (GetMetricHistory) and ListArtifacts. Each takes the mlflow-tracking-server
# resource: this server's ARN. Artifacts go to the bucket with the job's own credentials.
data "aws_iam_policy_document" "client" {
  statement {
    sid = "LogToTheTrackingServer"
    actions = [for action in [
      "GetExperimentByName", "GetExperiment", "CreateExperiment", "SearchExperiments", "SearchRuns", "CreateRun",
      "GetRun", "UpdateRun", "LogBatch", "LogMetric", "LogParam", "SetTag", "GetMetricHistory", "ListArtifacts",
    ] : "sagemaker-mlflow:${action}"]
    resources = [local.server_arn]
  }

  statement {
    sid       = "WriteArtifacts"
    actions   = ["s3:PutObject", "s3:GetObject", "s3:ListBucket"]
    resources = [local.bucket_arn, "${local.bucket_arn}/*"]
  }

  # ArtifactsKey, last, as before: no statement here has its sid, so it overrides nothing.
  override_policy_documents = [data.aws_iam_policy_document.artifacts_key["ArtifactsKey"].json]
}
