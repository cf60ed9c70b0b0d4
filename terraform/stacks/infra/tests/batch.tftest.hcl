# The AWS Batch part of the infra stack (batch_enabled), with mocked AWS: what `--target batch` jobs run on.

mock_provider "aws" {
  source = "../../tests/mocks"
}

# Own ids for the GPU subnet and for each security group, so "in the GPU subnet" or "to the FSx group" cannot pass
# by accident (the shared mocks give every subnet and every group the same id).
override_resource {
  target = module.network.aws_subnet.gpu[0]
  values = { id = "subnet-0fffffffffffffff1", availability_zone = "us-east-1b" }
}
override_resource {
  target = module.fsx_lustre.aws_security_group.lustre[0]
  values = { id = "sg-0fa5f5a0f5a0f5a01" }
}
override_resource {
  target = module.batch.aws_security_group.this[0]
  values = { id = "sg-0ba7cba7cba7cba71" }
}
override_resource {
  target = module.batch.aws_iam_role.job[0]
  values = { arn = "arn:aws:iam::123456789012:role/trainkit-batch-job", name = "trainkit-batch-job" }
}
override_resource {
  target = module.batch.aws_iam_role.execution[0]
  values = { arn = "arn:aws:iam::123456789012:role/trainkit-batch-execution", name = "trainkit-batch-execution" }
}
# The MLflow token's secret gets its own ARN (the shared mocks give every secret the Hugging Face token's), so "the
# role reads both secrets" cannot pass with one.
override_resource {
  target = aws_secretsmanager_secret.job_token["mlflow-token"]
  values = { arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:trainkit-mlflow-token-GhIjKl" }
}

variables {
  region                = "us-east-1"
  availability_zones    = ["us-east-1a", "us-east-1b", "us-east-1c"]
  gpu_availability_zone = "us-east-1b"
  owner                 = "ci@example.com"
  public_access_cidrs   = ["203.0.113.0/24"]
  stack_id              = "trainkit-test"
}

run "nothing_is_created_when_batch_enabled_is_false" {
  command = plan

  assert {
    condition     = output.batch == null && module.batch.compute_environment == null && module.batch.launch_template == null
    error_message = "Without batch_enabled the stack has no Batch part."
  }
  assert {
    condition     = module.batch.job_queue == null && module.batch.security_group_id == null && length(module.batch.role_policies.execution) == 0
    error_message = "Without batch_enabled there is no queue, security group or role."
  }
  assert {
    condition     = !contains(keys(aws_secretsmanager_secret.job_token), "hf-token")
    error_message = "Neither SageMaker nor Batch: no token secret."
  }
  assert {
    condition     = !contains(keys(aws_secretsmanager_secret.job_token), "mlflow-token")
    error_message = "Neither SageMaker nor Batch: no MLflow token secret."
  }
}

run "p5_batch_part_with_32_efa_interfaces_in_the_gpu_subnet_from_zero_vcpus" {
  command = apply

  variables {
    batch_enabled = true
  }

  # The launch template: every EFA interface of p5.48xlarge, IMDSv2, encrypted root volume, user data mounting FSx.
  assert {
    condition     = length(module.batch.launch_template.interfaces) == 32
    error_message = "A p5.48xlarge Batch instance must get all 32 EFA interfaces."
  }
  assert {
    condition     = [for ni in module.batch.launch_template.interfaces : ni.type if ni.card == 0] == ["efa"] && length([for ni in module.batch.launch_template.interfaces : ni if ni.type == "efa-only"]) == 31
    error_message = "p5: card 0 carries the efa primary interface, the other 31 cards efa-only (the gpu-nodegroup module's layout)."
  }
  assert {
    condition     = alltrue([for ni in module.batch.launch_template.interfaces : jsonencode(ni.security_groups) == jsonencode(["sg-0ba7cba7cba7cba71"])])
    error_message = "Every interface carries the Batch security group (all traffic from itself: EFA)."
  }
  assert {
    condition     = module.batch.launch_template.metadata.http_tokens == "required" && module.batch.launch_template.metadata.http_put_response_hop_limit == 1
    error_message = "IMDSv2 only, hop limit 1: containers cannot reach the instance role."
  }
  assert {
    condition     = module.batch.launch_template.root.encrypted == "true" && module.batch.launch_template.root.kms_key_id == aws_kms_key.this.arn
    error_message = "Root volumes are encrypted with the stack's KMS key."
  }
  assert {
    condition     = startswith(module.batch.launch_template.user_data, "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"==TRAINKIT==\"\n") && endswith(module.batch.launch_template.user_data, "--==TRAINKIT==--\n")
    error_message = "Batch merges launch template user data with its own: it must be a MIME multi-part archive."
  }
  assert {
    condition     = strcontains(module.batch.launch_template.user_data, "fs-0a1b2c3d4e5f60718.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh /fsx lustre") && strcontains(module.batch.launch_template.user_data, "mountpoint -q /fsx")
    error_message = "The user data mounts the stack's FSx for Lustre (its DNS name and mount name) at /fsx, and fails when it cannot."
  }
  assert {
    condition     = strcontains(module.batch.launch_template.user_data, "if ! efa_ready; then") && strcontains(module.batch.launch_template.user_data, "curl -fsSL --retry 5 -o \"$work/aws-efa-installer-latest.tar.gz\" https://efa-installer.amazonaws.com/aws-efa-installer-latest.tar.gz") && strcontains(module.batch.launch_template.user_data, "./efa_installer.sh -y")
    error_message = "An instance without the efa provider installs the EFA software from AWS's installer at boot."
  }
  assert {
    condition     = strcontains(module.batch.launch_template.user_data, "efa_ready() { /opt/amazon/efa/bin/fi_info -p efa >/dev/null 2>&1; }") && strcontains(module.batch.launch_template.user_data, "systemctl mask --now --no-block ecs.service\n  shutdown -h +1 \"trainkit: no EFA provider: powering off\"\n  exit 1")
    error_message = "An instance that still has no EFA provider keeps its ECS agent from starting, fails its user data and powers off: it never runs a job, nor bills idle."
  }
  assert {
    condition     = strcontains(module.batch.launch_template.user_data, "ECS_ENABLE_AWSLOGS_EXECUTIONROLE_OVERRIDE=true") && strcontains(module.batch.launch_template.user_data, "ECS_AWSVPC_BLOCK_IMDS=true")
    error_message = "The ECS agent injects the token with the execution role, and awsvpc containers cannot reach IMDS."
  }

  # The compute environment: EC2 On-Demand in the GPU subnet's AZ, from 0 vCPUs, in a cluster placement group.
  assert {
    condition     = jsonencode(module.batch.compute_environment.subnets) == jsonencode(["subnet-0fffffffffffffff1"]) && module.network.gpu_az == var.gpu_availability_zone
    error_message = "The compute environment is in the GPU subnet, the AZ of the GPU capacity and of FSx for Lustre."
  }
  assert {
    condition     = module.batch.compute_environment.min_vcpus == 0
    error_message = "Min vCPUs is 0: nothing runs, nothing bills, between jobs."
  }
  assert {
    condition     = module.batch.compute_environment.max_vcpus == 384 && output.batch.max_nodes == 2
    error_message = "Max vCPUs is batch_max_nodes (2) p5.48xlarge of 192 vCPUs."
  }
  assert {
    condition     = module.batch.compute_environment.type == "MANAGED" && module.batch.compute_environment.capacity == "EC2"
    error_message = "A managed EC2 On-Demand environment: Batch runs no multi-node jobs on Spot."
  }
  assert {
    condition     = startswith(module.batch.compute_environment.instance_role, "arn:aws:iam::123456789012:instance-profile/")
    error_message = "The environment's instance role is an instance profile's ARN, as Batch requires (not a role's)."
  }
  assert {
    condition     = module.batch.compute_environment.allocation_strategy == "BEST_FIT"
    error_message = "BEST_FIT never launches beyond max vCPUs."
  }
  assert {
    condition     = module.batch.compute_environment.placement_group == "trainkit-batch" && module.batch.compute_environment.placement_strategy == "cluster"
    error_message = "The instances launch into one cluster placement group."
  }
  assert {
    condition     = jsonencode(module.batch.compute_environment.security_group_ids) == jsonencode(["sg-0ba7cba7cba7cba71"]) && module.batch.compute_environment.launch_template == "lt-0a1b2c3d4e5f60718"
    error_message = "The environment names the Batch security group (the jobs' awsvpc interfaces get it) and the launch template."
  }
  assert {
    condition     = module.batch.compute_environment.image_type == "ECS_AL2023_NVIDIA" && jsonencode(module.batch.compute_environment.instance_types) == jsonencode(["p5.48xlarge"])
    error_message = "Batch's Amazon Linux 2023 GPU AMI on the stack's gpu_instance_type by default."
  }
  assert {
    condition     = module.batch.compute_environment.instance_tags["trainkit:stack-id"] == "trainkit-test"
    error_message = "The instances Batch launches carry the stack's tag, which the audit looks for."
  }
  assert {
    condition     = jsonencode(module.batch.job_queue.compute_environments) == jsonencode([output.batch.compute_environment_arn])
    error_message = "The job queue runs on the compute environment."
  }
  assert {
    condition     = jsonencode(module.batch.job_queue.runnable_limits) == jsonencode({ "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY" = 3600, "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE" = 600, "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT" = 600 })
    error_message = "A job waiting an hour for capacity, or one that can never fit, is cancelled rather than held."
  }

  # The security group: all traffic among the job's instances, HTTPS out, Lustre to and from FSx only.
  assert {
    condition     = module.batch.traffic.ingress == module.batch.traffic.group && module.batch.traffic.egress == module.batch.traffic.group
    error_message = "EFA needs all traffic to and from the group itself."
  }
  assert {
    condition     = jsonencode(module.batch.traffic.open_egress) == jsonencode(["0.0.0.0/0:443-443"])
    error_message = "Out to anywhere: HTTPS only."
  }
  assert {
    condition     = jsonencode(module.batch.traffic.lustre_out) == jsonencode(["sg-0fa5f5a0f5a0f5a01:1018-1023", "sg-0fa5f5a0f5a0f5a01:988-988"]) && jsonencode(module.batch.traffic.lustre_in) == jsonencode(module.batch.traffic.lustre_out)
    error_message = "The instances reach FSx for Lustre on its ports, and only its group."
  }
  assert {
    condition     = jsonencode(module.batch.traffic.fsx_admits_us) == jsonencode(["sg-0fa5f5a0f5a0f5a01<-sg-0ba7cba7cba7cba71:1018-1023", "sg-0fa5f5a0f5a0f5a01<-sg-0ba7cba7cba7cba71:988-988"])
    error_message = "The file system's group admits the Batch group on the Lustre ports."
  }

  # The job role without data_source_buckets: no policy at all.
  assert {
    condition     = length(module.batch.job_grants) == 0 && length(module.batch.role_policies.job) == 0
    error_message = "Without data_source_buckets the job role cannot do anything."
  }
  assert {
    condition     = jsonencode(module.batch.role_policies.instance) == jsonencode(["arn:aws:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role"])
    error_message = "The instance role is the ECS agent's, nothing more."
  }

  # The output the Batch backend reads.
  assert {
    condition = toset(keys(output.batch)) == toset([
      "job_queue_arn", "job_queue_name", "compute_environment_arn", "job_role_arn", "execution_role_arn",
      "instance_types", "fsx_mount_path", "log_group", "hf_token_secret_arn", "mlflow_token_secret_arn", "max_nodes",
    ])
    error_message = "The batch output has exactly the keys the Batch backend reads."
  }
  assert {
    condition     = output.batch.job_queue_name == "trainkit-batch" && startswith(output.batch.job_queue_arn, "arn:aws:batch:") && startswith(output.batch.compute_environment_arn, "arn:aws:batch:")
    error_message = "The queue and the environment are exported."
  }
  assert {
    condition     = output.batch.fsx_mount_path == "/fsx" && output.batch.log_group == "/aws/batch/job" && jsonencode(output.batch.instance_types) == jsonencode(["p5.48xlarge"])
    error_message = "The mount path, the log group and the instance types are exported."
  }
  assert {
    condition     = output.batch.hf_token_secret_arn == aws_secretsmanager_secret.job_token["hf-token"].arn && output.sagemaker == null
    error_message = "Batch alone has the stack's token secret."
  }
  assert {
    condition     = output.batch.mlflow_token_secret_arn == aws_secretsmanager_secret.job_token["mlflow-token"].arn && output.batch.mlflow_token_secret_arn != output.batch.hf_token_secret_arn
    error_message = "Batch alone has the stack's MLflow token secret, a secret of its own."
  }
  # Made like the Hugging Face token's: empty (its value is put by `invoke secrets.mlflow-token`, never in the state),
  # encrypted with the stack's key, deleted at once by `make down`.
  assert {
    condition     = aws_secretsmanager_secret.job_token["mlflow-token"].name_prefix == "trainkit-mlflow-token-" && aws_secretsmanager_secret.job_token["mlflow-token"].kms_key_id == aws_kms_key.this.arn && aws_secretsmanager_secret.job_token["mlflow-token"].recovery_window_in_days == 0
    error_message = "The MLflow token's secret is the stack's, encrypted with its key, with no recovery window."
  }
  assert {
    condition     = aws_secretsmanager_secret.job_token["hf-token"].name_prefix == "trainkit-hf-token-" && aws_secretsmanager_secret.job_token["hf-token"].kms_key_id == aws_kms_key.this.arn && aws_secretsmanager_secret.job_token["hf-token"].recovery_window_in_days == 0
    error_message = "The Hugging Face token's secret keeps its name prefix, encrypted with the stack's key, with no recovery window."
  }
  assert {
    condition     = jsonencode(module.batch.execution_grants.ReadTheToken) == jsonencode({ actions = ["secretsmanager:GetSecretValue"], resources = sort([output.batch.hf_token_secret_arn, output.batch.mlflow_token_secret_arn]) })
    error_message = "The execution role reads both token secrets, the Hugging Face token's and the MLflow token's."
  }
}

run "the_execution_role_reads_only_the_token_secrets_shared_with_sagemaker_and_the_job_role_only_the_datasets" {
  command = apply

  variables {
    batch_enabled       = true
    sagemaker_enabled   = true
    data_source_buckets = ["datasets"]
  }

  # AWS Batch User Guide, "Specifying sensitive data with Secrets Manager": the execution role needs
  # secretsmanager:GetSecretValue on each secret a job definition's `secrets` names, and kms:Decrypt where the secret
  # is encrypted with a customer managed key (the stack's).
  assert {
    condition     = jsonencode(module.batch.execution_grants.ReadTheToken) == jsonencode({ actions = ["secretsmanager:GetSecretValue"], resources = sort([output.batch.hf_token_secret_arn, output.batch.mlflow_token_secret_arn]) })
    error_message = "The execution role reads exactly the token secrets: the Hugging Face token's and the MLflow token's."
  }
  assert {
    condition     = output.batch.mlflow_token_secret_arn == aws_secretsmanager_secret.job_token["mlflow-token"].arn && contains(module.batch.execution_grants.ReadTheToken.resources, "arn:aws:secretsmanager:us-east-1:123456789012:secret:trainkit-mlflow-token-GhIjKl")
    error_message = "The batch output carries the MLflow token secret's ARN, and the execution role's policy names it."
  }
  assert {
    condition     = [for sid, grant in module.batch.execution_grants : sid if anytrue([for action in grant.actions : startswith(action, "secretsmanager:")])] == ["ReadTheToken"]
    error_message = "No other statement of the execution role touches Secrets Manager."
  }
  assert {
    condition     = jsonencode(module.batch.execution_grants.DecryptTheToken) == jsonencode({ actions = ["kms:Decrypt"], resources = [aws_kms_key.this.arn] })
    error_message = "The execution role decrypts with the stack's key (through Secrets Manager) and nothing else."
  }
  assert {
    condition     = jsonencode(module.batch.execution_grants.PullTheImage.resources) == jsonencode(sort(distinct(values(module.ecr.repository_arns)))) && jsonencode(module.batch.execution_grants.WriteLogs) == jsonencode({ actions = ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"], resources = ["arn:aws:logs:us-east-1:123456789012:log-group:/aws/batch/job", "arn:aws:logs:us-east-1:123456789012:log-group:/aws/batch/job:*"] })
    error_message = "The execution role pulls from this stack's ECR only and writes /aws/batch/job only."
  }
  assert {
    condition     = jsonencode(module.batch.job_grants) == jsonencode({ ReadDatasets = { actions = ["s3:GetObject", "s3:ListBucket"], resources = ["arn:aws:s3:::datasets", "arn:aws:s3:::datasets/*"] } })
    error_message = "The job role cannot read the token, write to S3 or reach anything but the named datasets (list and read)."
  }
  assert {
    condition     = jsonencode(module.batch.trust.task) == jsonencode({ service = ["ecs-tasks.amazonaws.com"], source_account = ["123456789012"] }) && jsonencode(module.batch.trust.instance) == jsonencode(["ec2.amazonaws.com"])
    error_message = "Only ECS, acting for this account, assumes the job and execution roles; the instance role is EC2's."
  }
  assert {
    condition     = output.batch.job_role_arn != output.batch.execution_role_arn
    error_message = "The containers' role is not the agent's."
  }

  # One Hugging Face token secret for SageMaker and Batch.
  assert {
    condition     = contains(keys(aws_secretsmanager_secret.job_token), "hf-token") && output.batch.hf_token_secret_arn == output.sagemaker.hf_token_secret_arn
    error_message = "One Hugging Face token secret serves both targets."
  }
  assert {
    condition     = jsonencode(module.sagemaker.grants.ReadTheToken) == jsonencode(sort([output.batch.hf_token_secret_arn, output.batch.mlflow_token_secret_arn])) && jsonencode(module.batch.execution_grants.ReadTheToken.resources) == jsonencode(sort([output.sagemaker.hf_token_secret_arn, output.sagemaker.mlflow_token_secret_arn]))
    error_message = "Both execution roles read that one Hugging Face token secret and that one MLflow token secret."
  }

  # One MLflow token secret for SageMaker and Batch.
  assert {
    condition     = contains(keys(aws_secretsmanager_secret.job_token), "mlflow-token") && output.batch.mlflow_token_secret_arn == output.sagemaker.mlflow_token_secret_arn
    error_message = "One MLflow token secret serves both targets."
  }
}

run "p4d_gets_4_efa_interfaces_and_max_vcpus_follow_its_96" {
  command = apply

  variables {
    batch_enabled        = true
    batch_instance_types = ["p4d.24xlarge", "p4de.24xlarge"]
    batch_max_nodes      = 4
  }

  assert {
    condition     = length(module.batch.launch_template.interfaces) == 4 && alltrue([for ni in module.batch.launch_template.interfaces : ni.type == "efa"])
    error_message = "p4d.24xlarge has 4 EFA interfaces, all efa."
  }
  assert {
    condition     = module.batch.compute_environment.max_vcpus == 384 && output.batch.max_nodes == 4 && jsonencode(output.batch.instance_types) == jsonencode(["p4d.24xlarge", "p4de.24xlarge"])
    error_message = "4 nodes of 96 vCPUs."
  }
}

run "instance_types_with_different_efa_layouts_are_refused" {
  command = plan

  variables {
    batch_enabled        = true
    batch_instance_types = ["p5.48xlarge", "p4d.24xlarge"]
  }

  expect_failures = [var.batch_instance_types]
}

run "batch_without_fsx_is_refused" {
  command = plan

  variables {
    batch_enabled = true
    enable_fsx    = false
  }

  expect_failures = [var.batch_enabled]
}
