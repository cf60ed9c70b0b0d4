################################################################################
# AWS Batch (opt-in): an EC2 compute environment of GPU instances for multi-node parallel (MNP) jobs, its job
# queue, and what the jobs run as. The job definitions are registered by trainkit's Batch backend, one per job
# shape, tagged with the stack's trainkit:stack-id (`make down` deregisters them; the audit lists them).
#
# AWS Batch User Guide pages cited below by their file name: mnp-ce ("Compute environment considerations for
# MNP"), launch-templates ("Use Amazon EC2 launch templates with AWS Batch"), efa ("Elastic Fabric Adapter"),
# allocation-strategies, compute-environment-template, specifying-sensitive-data-secrets, using-service-linked-roles,
# job_stuck_in_runnable_time_limit_actions.
################################################################################

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  account   = data.aws_caller_identity.current.account_id
  partition = data.aws_partition.current.partition
  region    = data.aws_region.current.name

  # AWS Batch's default awslogs group (the awslogs driver's default when a job definition names none). AWS Batch
  # creates it (its service-linked role may logs:CreateLogGroup on /aws/batch/job*: using-service-linked-roles), and so
  # may the execution role, below; the stack does not manage it: it is the account's and region's, shared with every
  # other Batch job there (creating it fails where it exists; destroying it would delete other jobs' logs). Its
  # retention is set with `aws logs put-retention-policy --log-group-name /aws/batch/job` (docs/aws.md).
  log_group      = "/aws/batch/job"
  log_group_arn  = "arn:${local.partition}:logs:${local.region}:${local.account}:log-group:${local.log_group}"
  fsx_mount_path = "/fsx"
  data_arns      = [for bucket in var.data_source_buckets : "arn:${local.partition}:s3:::${bucket}"]
  first_type     = var.instance_types[0]
  instance_names = [for type in var.instance_types : type.name]
  # The secrets the execution role reads: the Hugging Face token and a self-hosted MLflow server's bearer token.
  token_secret_arns = compact([var.hf_token_secret_arn, var.mlflow_token_secret_arn])
  # A multi-node job's nodes are whole instances (one container each: multi-node-parallel-jobs), so max vCPUs is
  # a whole number of the first type's.
  max_vcpus = var.max_nodes * local.first_type.vcpus
}

################################################################################
# Security group: all traffic between the job's instances (EFA needs it), HTTPS out, Lustre to FSx
################################################################################

# Its own group rather than the EKS GPU nodes' EFA group (which would open every port between Batch jobs and the
# cluster's nodes) or SageMaker's (created only with sagemaker_enabled, and no FSx client). An MNP job's containers
# use the awsvpc network mode: each gets its own network interface with the compute environment's security groups,
# the VPC's default group when it names none (mnp-ce), so the environment names this one.
resource "aws_security_group" "this" {
  count = var.create ? 1 : 0

  name_prefix = "${var.name}-batch-"
  description = "trainkit AWS Batch instances and their jobs' network interfaces"
  vpc_id      = var.vpc_id
  tags        = { Name = "${var.name}-batch" }

  lifecycle {
    create_before_destroy = true
  }
}

# "The security group for the EFA must allow all inbound and outbound traffic to and from the security group
# itself" (efa).
resource "aws_vpc_security_group_ingress_rule" "self" {
  count = var.create ? 1 : 0

  security_group_id            = aws_security_group.this[0].id
  referenced_security_group_id = aws_security_group.this[0].id
  ip_protocol                  = "-1"
  description                  = "All traffic from the job's other instances (torchrun, NCCL, EFA)"
}

resource "aws_vpc_security_group_egress_rule" "self" {
  count = var.create ? 1 : 0

  security_group_id            = aws_security_group.this[0].id
  referenced_security_group_id = aws_security_group.this[0].id
  ip_protocol                  = "-1"
  description                  = "All traffic to the job's other instances (torchrun, NCCL, EFA)"
}

# The ECS agent reaches the ECS endpoints, images come from ECR and S3, logs go to CloudWatch Logs and the token
# from Secrets Manager, all over HTTPS through the NAT gateway (the awsvpc interfaces get no public address:
# mnp-ce); the Lustre client package comes from the Amazon Linux repositories, also over HTTPS.
resource "aws_vpc_security_group_egress_rule" "https" {
  count = var.create ? 1 : 0

  security_group_id = aws_security_group.this[0].id
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  description       = "HTTPS to ECS, ECR, S3, CloudWatch Logs, Secrets Manager (through the NAT gateway)"
}

locals {
  lustre_ports = var.create && var.fsx != null ? var.fsx.ports : {}
}

# The Lustre client talks to the file servers on the Lustre ports both ways (FSx for Lustre User Guide, "File
# system access control with Amazon VPC"). The rules on the file system's group live here, with the client they
# admit, so switching Batch off removes them and leaves the file system's own rules untouched.
resource "aws_vpc_security_group_egress_rule" "lustre" {
  for_each = local.lustre_ports

  security_group_id            = aws_security_group.this[0].id
  referenced_security_group_id = var.fsx.security_group_id
  ip_protocol                  = "tcp"
  from_port                    = each.value[0]
  to_port                      = each.value[1]
  description                  = "Lustre to FSx for Lustre (${each.key})"
}

resource "aws_vpc_security_group_ingress_rule" "lustre" {
  for_each = local.lustre_ports

  security_group_id            = aws_security_group.this[0].id
  referenced_security_group_id = var.fsx.security_group_id
  ip_protocol                  = "tcp"
  from_port                    = each.value[0]
  to_port                      = each.value[1]
  description                  = "Lustre from FSx for Lustre (${each.key})"
}

resource "aws_vpc_security_group_ingress_rule" "fsx_from_batch" {
  for_each = local.lustre_ports

  security_group_id            = var.fsx.security_group_id
  referenced_security_group_id = aws_security_group.this[0].id
  ip_protocol                  = "tcp"
  from_port                    = each.value[0]
  to_port                      = each.value[1]
  description                  = "Lustre from AWS Batch instances (${each.key})"
}

################################################################################
# Launch template: every EFA interface, IMDSv2, encrypted root volume, user data that mounts FSx
################################################################################

locals {
  # MIME multi-part, as Batch requires: it merges this user data with its own (launch-templates, "Amazon EC2 user
  # data in launch templates"). Shell parts run before the ECS agent starts.
  ecs_agent_part = <<-EOT
    #!/bin/bash
    set -euo pipefail
    # Amazon ECS container agent configuration (ECS Developer Guide, "Amazon ECS container agent configuration"):
    # - the awslogs driver and the secrets injection run with the job's execution role, not the instance role
    #   (specifying-sensitive-data-secrets requires ECS_ENABLE_AWSLOGS_EXECUTIONROLE_OVERRIDE=true);
    # - MNP containers use the awsvpc network mode (mnp-ce), whose interfaces would otherwise reach the instance
    #   metadata service and the instance role: jobs get their credentials from the job role only.
    cat >> /etc/ecs/ecs.config <<'CONFIG'
    ECS_ENABLE_AWSLOGS_EXECUTIONROLE_OVERRIDE=true
    ECS_AWSVPC_BLOCK_IMDS=true
    CONFIG
  EOT

  # FSx for Lustre User Guide, "Installing the Lustre client" (Amazon Linux 2023: dnf lustre-client) and "Mounting
  # from an Amazon EC2 instance" (relatime,flock). A failed mount fails this part only, and the instance still runs
  # jobs: each node refuses to start when /fsx is not a Lustre mount (trainkit/run/mounts.py), as its run folder
  # would otherwise land on the root volume.
  fsx_part = var.fsx == null ? "" : <<-EOT
    #!/bin/bash
    set -euo pipefail
    if command -v dnf >/dev/null; then dnf install -y lustre-client; else amazon-linux-extras install -y lustre; fi
    mkdir -p ${local.fsx_mount_path}
    echo "${var.fsx.dns_name}@tcp:/${var.fsx.mount_name} ${local.fsx_mount_path} lustre defaults,relatime,flock,_netdev 0 0" >> /etc/fstab
    for attempt in 1 2 3 4 5 6 7 8 9 10; do
      mount ${local.fsx_mount_path} && break
      echo "trainkit: mounting FSx for Lustre at ${local.fsx_mount_path} failed (attempt $attempt); retrying" >&2
      sleep 15
    done
    mountpoint -q ${local.fsx_mount_path}
  EOT

  # EFA needs the driver on the host ("The AMI has the EFA driver loaded": efa). Batch's ECS GPU AMI may lack it: the
  # build of aws/amazon-ecs-ami (al2023gpu.pkr.hcl, scripts/al2023/gpu/) installs no EFA software. So the node
  # installs it as aws-samples/aws-batch-efa's launch template does, with the installer and command the EC2 User
  # Guide documents ("Install the EFA software": efa_installer.sh -y), unless libfabric already finds the efa
  # provider (an AMI that ships it, `ami_id`). The ECS agent starts after cloud-init's user data whether or not a
  # part failed (ecs.service: After=cloud-final.service), so an instance still without EFA masks the agent (it never
  # joins the compute environment: Batch places no job on it) and powers off: a p5 that can run nothing must not
  # stay up billing. What Batch's Auto Scaling group then does with the stopped instance is cloud-only.
  efa_needed = anytrue([for ni in local.first_type.network_interfaces : contains(["efa", "efa-only"], ni.interface_type)])
  efa_part   = !local.efa_needed ? "" : <<-EOT
    #!/bin/bash
    set -uo pipefail
    efa_ready() { /opt/amazon/efa/bin/fi_info -p efa >/dev/null 2>&1; }
    if ! efa_ready; then
      work=$(mktemp -d)
      curl -fsSL --retry 5 -o "$work/aws-efa-installer-latest.tar.gz" https://efa-installer.amazonaws.com/aws-efa-installer-latest.tar.gz \
        && tar -xzf "$work/aws-efa-installer-latest.tar.gz" -C "$work" \
        && (cd "$work/aws-efa-installer" && ./efa_installer.sh -y)
      rm -rf "$work"
    fi
    if ! efa_ready; then
      echo "trainkit: no EFA provider (fi_info -p efa) on this instance: its ECS agent is masked, it runs no Batch job" >&2
      systemctl mask --now --no-block ecs.service
      shutdown -h +1 "trainkit: no EFA provider: powering off"
      exit 1
    fi
  EOT

  user_data = join("\n", concat(
    ["MIME-Version: 1.0", "Content-Type: multipart/mixed; boundary=\"==TRAINKIT==\"", ""],
    flatten([for part in compact([local.ecs_agent_part, local.efa_part, local.fsx_part]) : [
      "--==TRAINKIT==",
      "Content-Type: text/x-shellscript; charset=\"us-ascii\"",
      "",
      part,
    ]]),
    ["--==TRAINKIT==--", ""],
  ))
}

# "All instances that use an EFA should be in the same cluster placement group" (efa); "create a cluster placement
# group in a single Availability Zone and associate it with your compute resources" (mnp-ce).
resource "aws_placement_group" "this" {
  count = var.create && var.enable_placement_group ? 1 : 0

  name     = "${var.name}-batch"
  strategy = "cluster"
}

resource "aws_launch_template" "this" {
  count = var.create ? 1 : 0

  name_prefix = "${var.name}-batch-"
  description = "trainkit AWS Batch GPU instances: every EFA interface, IMDSv2, FSx for Lustre at /fsx"

  # The gpu-nodegroup module's layout (card 0: the primary interface, efa; P5: efa-only on the other cards). No
  # subnet here: Batch ignores a launch template's interface subnets and uses the compute environment's
  # (launch-templates).
  dynamic "network_interfaces" {
    for_each = local.first_type.network_interfaces
    content {
      network_card_index    = network_interfaces.value.network_card_index
      device_index          = network_interfaces.value.device_index
      interface_type        = network_interfaces.value.interface_type
      security_groups       = [aws_security_group.this[0].id]
      delete_on_termination = true
    }
  }

  metadata_options {
    http_endpoint = "enabled"
    http_tokens   = "required" # IMDSv2 only
    # Hop limit 1: the ECS agent runs with the host's network and reaches IMDS; containers are a hop further
    # (and their awsvpc interfaces are blocked: ECS_AWSVPC_BLOCK_IMDS in the user data).
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = var.root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      kms_key_id            = var.kms_key_arn
      delete_on_termination = true
    }
  }

  user_data = base64encode(local.user_data)

  dynamic "tag_specifications" {
    for_each = ["instance", "volume", "network-interface"]
    content {
      resource_type = tag_specifications.value
      tags          = merge(var.tags, { Name = "${var.name}-batch" })
    }
  }
}

################################################################################
# Compute environment and job queue
################################################################################

resource "aws_batch_compute_environment" "this" {
  count = var.create ? 1 : 0

  # No name: the provider generates a unique one, so a replacement (create before destroy, below) never collides.
  # (compute_environment_name_prefix of provider 5.x became name_prefix in 6.0; leaving both out works on both.)
  # No service_role: AWS Batch uses its service-linked role AWSServiceRoleForBatch, creating it on first use
  # (using-service-linked-roles); nothing of ours to delete before the environment on `make down`.
  type  = "MANAGED"
  state = "ENABLED"
  tags  = { Name = "${var.name}-batch" }

  compute_resources {
    # EC2 On-Demand, never SPOT: "Multi-node parallel jobs aren't supported on compute environments that use Spot
    # Instances" (mnp-ce), so this environment has no spot option.
    type = "EC2"
    # BEST_FIT never goes above max vCPUs; BEST_FIT_PROGRESSIVE may exceed it by one instance, one more p5
    # (allocation-strategies).
    allocation_strategy = "BEST_FIT"
    min_vcpus           = 0 # scale to zero: no job, no instance
    max_vcpus           = local.max_vcpus
    instance_type       = local.instance_names
    subnets             = [var.subnet_id]
    security_group_ids  = [aws_security_group.this[0].id]
    # An instance profile's ARN, not a role's (compute-environment-template).
    instance_role   = aws_iam_instance_profile.instance[0].arn
    placement_group = var.enable_placement_group ? aws_placement_group.this[0].name : null
    tags            = merge(var.tags, { Name = "${var.name}-batch" })

    launch_template {
      launch_template_id = aws_launch_template.this[0].id
      version            = tostring(aws_launch_template.this[0].latest_version)
    }

    ec2_configuration {
      image_type        = "ECS_AL2023_NVIDIA"
      image_id_override = var.ami_id
    }
  }

  # A changed launch template or size replaces the environment (BEST_FIT environments cannot be updated in place:
  # allocation-strategies); the new one exists before the queue moves to it and the old one goes.
  lifecycle {
    create_before_destroy = true
  }

  depends_on = [aws_iam_role_policy_attachment.instance]
}

resource "aws_batch_job_queue" "this" {
  count = var.create ? 1 : 0

  name     = "${var.name}-batch"
  state    = "ENABLED"
  priority = 1

  compute_environment_order {
    order               = 1
    compute_environment = aws_batch_compute_environment.this[0].arn
  }

  # A job that cannot get its instances is cancelled instead of holding the ones it has (a half-provisioned
  # multi-node job bills them) or blocking the queue; a job that can never fit is cancelled at the shortest time
  # Batch allows (job_stuck_in_runnable_time_limit_actions: ECS queues may only CANCEL, after 600 to 86400 s).
  job_state_time_limit_action {
    state            = "RUNNABLE"
    reason           = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
    max_time_seconds = var.capacity_wait_minutes * 60
    action           = "CANCEL"
  }
  dynamic "job_state_time_limit_action" {
    for_each = ["MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE", "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT"]
    content {
      state            = "RUNNABLE"
      reason           = job_state_time_limit_action.value
      max_time_seconds = 600
      action           = "CANCEL"
    }
  }
}

################################################################################
# The instances' role: the ECS agent's
################################################################################

data "aws_iam_policy_document" "instance_trust" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "instance" {
  count = var.create ? 1 : 0

  name_prefix        = "${substr(var.name, 0, 24)}-batch-node-" # IAM allows a 38-character prefix
  assume_role_policy = data.aws_iam_policy_document.instance_trust.json
}

# What the ECS agent on a Batch instance needs (AWS Batch User Guide, "Amazon ECS instance role"). Containers cannot
# use it: IMDS is blocked for their awsvpc interfaces (user data) and one hop too far for anything else.
resource "aws_iam_role_policy_attachment" "instance" {
  count = var.create ? 1 : 0

  role       = aws_iam_role.instance[0].name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role"
}

resource "aws_iam_instance_profile" "instance" {
  count = var.create ? 1 : 0

  name_prefix = "${substr(var.name, 0, 24)}-batch-node-"
  role        = aws_iam_role.instance[0].name
}

################################################################################
# The execution role (the ECS agent, for one job): pull the image, write the logs, read the tokens' secrets
################################################################################

data "aws_iam_policy_document" "task_trust" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }
    # Confused deputy: only ECS acting for this account (ECS Developer Guide, "Task execution IAM role").
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account]
    }
  }
}

resource "aws_iam_role" "execution" {
  count = var.create ? 1 : 0

  name_prefix        = "${substr(var.name, 0, 24)}-batch-exec-"
  assume_role_policy = data.aws_iam_policy_document.task_trust.json
}

data "aws_iam_policy_document" "execution" {
  statement {
    sid       = "EcrLogin"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"] # the action has no resource type (Service Authorization Reference, Amazon ECR)
  }
  statement {
    sid       = "PullTheImage"
    actions   = ["ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage"]
    resources = var.image_repository_arns
  }
  # The awslogs driver runs with this role (ECS_ENABLE_AWSLOGS_EXECUTIONROLE_OVERRIDE, user data); it may create the
  # group where it does not exist yet (a job definition's awslogs-create-group), since the stack does not manage it.
  statement {
    sid       = "WriteLogs"
    actions   = ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"]
    resources = [local.log_group_arn, "${local.log_group_arn}:*"]
  }
  # The job definition's `secrets` names a secret's ARN (the Hugging Face token's, a self-hosted MLflow server's bearer
  # token's); the agent reads the value when the job starts and puts it in the container's environment: it is never
  # in the job definition, the state or the logs (specifying-sensitive-data-secrets: secretsmanager:GetSecretValue,
  # and kms:Decrypt for a customer key). One statement for exactly these secrets.
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
}

resource "aws_iam_role_policy" "execution" {
  count = var.create ? 1 : 0

  name   = "trainkit-batch-execution"
  role   = aws_iam_role.execution[0].id
  policy = data.aws_iam_policy_document.execution.json
}

################################################################################
# The job role (the containers'): the named datasets, read only, and nothing else
################################################################################

# The run folder lives on FSx, the token arrives as an environment variable and metrics are scraped, so a training
# job needs no AWS permission; the data-preparation job lists and reads data_source_buckets.
resource "aws_iam_role" "job" {
  count = var.create ? 1 : 0

  name_prefix        = "${substr(var.name, 0, 24)}-batch-job-"
  assume_role_policy = data.aws_iam_policy_document.task_trust.json
}

data "aws_iam_policy_document" "job" {
  dynamic "statement" {
    for_each = length(local.data_arns) > 0 ? [1] : []
    content {
      sid       = "ReadDatasets"
      actions   = ["s3:ListBucket", "s3:GetObject"]
      resources = concat(local.data_arns, [for arn in local.data_arns : "${arn}/*"])
    }
  }
}

resource "aws_iam_role_policy" "job" {
  count = var.create && length(local.data_arns) > 0 ? 1 : 0

  name   = "trainkit-batch-job"
  role   = aws_iam_role.job[0].id
  policy = data.aws_iam_policy_document.job.json
}

################################################################################
# Experiment tracking: the job role (the containers' credentials) logs to the stack's managed MLflow tracking server
################################################################################

resource "aws_iam_role_policy" "mlflow" {
  count = var.create && var.mlflow_enabled ? 1 : 0

  name   = "trainkit-mlflow-client"
  role   = aws_iam_role.job[0].id
  policy = var.mlflow_client_policy_json
}
