################################################################################
# Network
#
# Public subnets (NAT, load balancers) and private subnets in every AZ; one large private GPU subnet
# pinned to the GPU/FSx AZ, so GPU nodes, their EFA traffic and FSx share one AZ. One NAT gateway:
# the training data path is the S3 gateway endpoint and FSx, not the internet.
################################################################################

locals {
  create = var.create
  # /16 -> /20 public and private subnets per AZ, and one /18 GPU subnet at the top of the range.
  public_cidrs  = [for i, _ in var.azs : cidrsubnet(var.cidr, 4, i)]
  private_cidrs = [for i, _ in var.azs : cidrsubnet(var.cidr, 4, 4 + i)]
  gpu_cidr      = cidrsubnet(var.cidr, 2, 3)
  gpu_az_index  = index(var.azs, var.gpu_az)
}

resource "aws_vpc" "this" {
  count = local.create ? 1 : 0

  cidr_block           = var.cidr
  enable_dns_support   = true
  enable_dns_hostnames = true

  tags = merge(var.tags, { Name = var.name })
}

resource "aws_default_security_group" "this" {
  count = local.create ? 1 : 0

  # No rules: nothing may use the default security group.
  vpc_id = aws_vpc.this[0].id
  tags   = merge(var.tags, { Name = "${var.name}-default-deny" })
}

resource "aws_internet_gateway" "this" {
  count = local.create ? 1 : 0

  vpc_id = aws_vpc.this[0].id
  tags   = merge(var.tags, { Name = var.name })
}

resource "aws_subnet" "public" {
  count = local.create ? length(var.azs) : 0

  vpc_id            = aws_vpc.this[0].id
  availability_zone = var.azs[count.index]
  cidr_block        = local.public_cidrs[count.index]

  tags = merge(var.tags, { Name = "${var.name}-public-${var.azs[count.index]}", "kubernetes.io/role/elb" = "1" })
}

resource "aws_subnet" "private" {
  count = local.create ? length(var.azs) : 0

  vpc_id            = aws_vpc.this[0].id
  availability_zone = var.azs[count.index]
  cidr_block        = local.private_cidrs[count.index]

  tags = merge(var.tags, { Name = "${var.name}-private-${var.azs[count.index]}", "kubernetes.io/role/internal-elb" = "1" })
}

resource "aws_subnet" "gpu" {
  count = local.create ? 1 : 0

  vpc_id            = aws_vpc.this[0].id
  availability_zone = var.gpu_az
  cidr_block        = local.gpu_cidr

  tags = merge(var.tags, { Name = "${var.name}-gpu-${var.gpu_az}", "trainkit/subnet" = "gpu" })
}

resource "aws_eip" "nat" {
  count = local.create ? 1 : 0

  domain = "vpc"
  tags   = merge(var.tags, { Name = "${var.name}-nat" })
}

resource "aws_nat_gateway" "this" {
  count = local.create ? 1 : 0

  allocation_id = aws_eip.nat[0].id
  subnet_id     = aws_subnet.public[local.gpu_az_index].id
  tags          = merge(var.tags, { Name = var.name })

  depends_on = [aws_internet_gateway.this]
}

resource "aws_route_table" "public" {
  count = local.create ? 1 : 0

  vpc_id = aws_vpc.this[0].id
  tags   = merge(var.tags, { Name = "${var.name}-public" })
}

resource "aws_route" "public_internet" {
  count = local.create ? 1 : 0

  route_table_id         = aws_route_table.public[0].id
  destination_cidr_block = "0.0.0.0/0"
  gateway_id             = aws_internet_gateway.this[0].id
}

resource "aws_route_table_association" "public" {
  count = local.create ? length(var.azs) : 0

  subnet_id      = aws_subnet.public[count.index].id
  route_table_id = aws_route_table.public[0].id
}

resource "aws_route_table" "private" {
  count = local.create ? 1 : 0

  vpc_id = aws_vpc.this[0].id
  tags   = merge(var.tags, { Name = "${var.name}-private" })
}

resource "aws_route" "private_nat" {
  count = local.create ? 1 : 0

  route_table_id         = aws_route_table.private[0].id
  destination_cidr_block = "0.0.0.0/0"
  nat_gateway_id         = aws_nat_gateway.this[0].id
}

resource "aws_route_table_association" "private" {
  count = local.create ? length(var.azs) : 0

  subnet_id      = aws_subnet.private[count.index].id
  route_table_id = aws_route_table.private[0].id
}

resource "aws_route_table_association" "gpu" {
  count = local.create ? 1 : 0

  subnet_id      = aws_subnet.gpu[0].id
  route_table_id = aws_route_table.private[0].id
}

data "aws_region" "current" {}

resource "aws_vpc_endpoint" "s3" {
  count = local.create ? 1 : 0

  # Gateway endpoint: S3 traffic (datasets, checkpoints) bypasses the NAT gateway and its charges.
  vpc_id            = aws_vpc.this[0].id
  service_name      = "com.amazonaws.${data.aws_region.current.name}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = [aws_route_table.private[0].id]
  tags              = merge(var.tags, { Name = "${var.name}-s3" })
}

################################################################################
# Flow logs
################################################################################

resource "aws_cloudwatch_log_group" "flow_logs" {
  count = local.create && var.enable_flow_logs ? 1 : 0

  name              = "/trainkit/${var.name}/vpc-flow-logs"
  retention_in_days = var.flow_log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = var.tags
}

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

data "aws_iam_policy_document" "flow_logs_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["vpc-flow-logs.amazonaws.com"]
    }
    # Confused deputy: only the flow logs service acting for this account's flow logs in this region (VPC User Guide,
    # "IAM role for publishing flow logs to CloudWatch Logs", trust policy with aws:SourceAccount and aws:SourceArn;
    # IAM User Guide, "The confused deputy problem").
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }
    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = ["arn:${data.aws_partition.current.partition}:ec2:${data.aws_region.current.name}:${data.aws_caller_identity.current.account_id}:vpc-flow-log/*"]
    }
  }
}

data "aws_iam_policy_document" "flow_logs" {
  statement {
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]
    resources = ["${try(aws_cloudwatch_log_group.flow_logs[0].arn, "*")}:*"]
  }
}

resource "aws_iam_role" "flow_logs" {
  count = local.create && var.enable_flow_logs ? 1 : 0

  name_prefix        = "${substr(var.name, 0, 20)}-flow-logs-"
  assume_role_policy = data.aws_iam_policy_document.flow_logs_assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy" "flow_logs" {
  count = local.create && var.enable_flow_logs ? 1 : 0

  role   = aws_iam_role.flow_logs[0].id
  policy = data.aws_iam_policy_document.flow_logs.json
}

resource "aws_flow_log" "this" {
  count = local.create && var.enable_flow_logs ? 1 : 0

  vpc_id          = aws_vpc.this[0].id
  traffic_type    = "ALL"
  log_destination = aws_cloudwatch_log_group.flow_logs[0].arn
  iam_role_arn    = aws_iam_role.flow_logs[0].arn
  tags            = var.tags
}
