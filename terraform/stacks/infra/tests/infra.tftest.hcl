mock_provider "aws" {
  source = "../../tests/mocks"
}

# The GPU subnet gets its own id so "FSx lives in the GPU subnet" cannot pass by accident.
override_resource {
  target = module.network.aws_subnet.gpu[0]
  values = { id = "subnet-0fffffffffffffff1", availability_zone = "us-east-1b" }
}
# So does the MLflow token's secret (the shared mocks give every secret the Hugging Face token's ARN), so "the role
# reads both secrets" cannot pass with one.
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

run "fsx_lives_in_the_gpu_subnet_and_its_az" {
  command = apply

  assert {
    condition     = module.fsx_lustre.subnet_id == "subnet-0fffffffffffffff1" && module.network.gpu_subnet_id == "subnet-0fffffffffffffff1"
    error_message = "FSx must sit in the GPU subnet."
  }
  assert {
    condition     = output.gpu_availability_zone == var.gpu_availability_zone
    error_message = "The GPU subnet (and so FSx) is in gpu_availability_zone."
  }
}

run "fsx_squashes_root_everywhere_but_on_the_system_nodes" {
  command = apply

  # 10.0.0.0/16: the private subnets are 10.0.64.0/20, 10.0.80.0/20, 10.0.96.0/20; the GPU subnet, 10.0.192.0/18,
  # is in none of the ranges.
  assert {
    condition     = module.fsx_lustre.root_squash.root_squash == "65534:65534" && module.fsx_lustre.root_squash.no_squash_nids == toset(["10.0.[64-79].[0-255]@tcp", "10.0.[80-95].[0-255]@tcp", "10.0.[96-111].[0-255]@tcp"])
    error_message = "FSx squashes root to nobody except from the system nodes' subnets."
  }
}

run "fsx_root_squash_can_be_switched_off" {
  command = plan

  variables {
    fsx_root_squash = false
  }

  assert {
    condition     = module.fsx_lustre.root_squash == null
    error_message = "fsx_root_squash = false leaves root as root."
  }
}

run "secrets_volumes_and_fsx_use_the_stack_kms_key" {
  command = apply

  assert {
    condition     = module.eks.secrets_kms_key_arn == aws_kms_key.this.arn
    error_message = "Kubernetes secrets must be envelope-encrypted with the stack's KMS key."
  }
  assert {
    condition     = module.fsx_lustre.kms_key_id == aws_kms_key.this.arn
    error_message = "FSx must be encrypted with the stack's KMS key."
  }
  assert {
    condition     = aws_kms_key.this.enable_key_rotation
    error_message = "KMS key rotation must be on."
  }
}

run "an_account_without_the_autoscaling_role_gets_it_before_the_key" {
  command = plan

  override_data {
    target = data.aws_iam_roles.autoscaling
    values = { names = [] }
  }

  assert {
    condition     = length(aws_iam_service_linked_role.autoscaling) == 1 && aws_iam_service_linked_role.autoscaling[0].aws_service_name == "autoscaling.amazonaws.com"
    error_message = "The key policy names AWSServiceRoleForAutoScaling, which KMS requires to exist: an account that never had an Auto Scaling group gets it from this stack."
  }
}

run "an_account_that_has_the_autoscaling_role_keeps_it_as_it_is" {
  command = plan

  override_data {
    target = data.aws_iam_roles.autoscaling
    values = { names = ["AWSServiceRoleForAutoScaling"] }
  }
  override_data {
    target = data.aws_iam_role.autoscaling
    values = { tags = {} }
  }

  assert {
    condition     = length(aws_iam_service_linked_role.autoscaling) == 0
    error_message = "IAM refuses a second AWSServiceRoleForAutoScaling; the account's own is used (and never deleted)."
  }
}

run "the_autoscaling_role_this_stack_made_stays_in_its_state" {
  command = plan

  override_data {
    target = data.aws_iam_roles.autoscaling
    values = { names = ["AWSServiceRoleForAutoScaling"] }
  }
  override_data {
    target = data.aws_iam_role.autoscaling
    values = { tags = { "trainkit:stack-id" = "trainkit-test" } }
  }

  assert {
    condition     = length(aws_iam_service_linked_role.autoscaling) == 1
    error_message = "Once made, the lookup finds the stack's own role: it stays planned, not destroyed."
  }
}

run "outputs_the_launcher_needs" {
  command = apply

  assert {
    condition     = output.gpus_per_node == 8 && output.efa_interfaces_per_node == 32 && output.gpu_instance_type == "p5.48xlarge"
    error_message = "Defaults: p5.48xlarge with 8 GPUs and 32 EFA interfaces."
  }
  assert {
    condition     = startswith(output.cluster_endpoint, "https://") && output.fsx_file_system_id == "fs-0a1b2c3d4e5f60718"
    error_message = "Cluster endpoint and FSx id are exported."
  }
  assert {
    condition     = toset(keys(output.ecr_repository_urls)) == toset(["train", "data-prep", "idle-guard"])
    error_message = "The image repositories are exported; the platform's image (idle guard, etcd issuer) gets its own, whose lifecycle rules training pushes do not touch."
  }
  assert {
    condition     = output.gpu_nodegroup.cluster_name == output.cluster_name && output.gpu_nodegroup.nodegroup == "gpu" && output.gpu_nodegroup.region == "us-east-1"
    error_message = "The GPU node group's names as EKS knows them are exported: the launcher asks that group for a job's nodes."
  }
  assert {
    condition     = output.idle_guard.window_minutes == 30 && output.idle_guard.nodegroup == output.gpu_nodegroup.nodegroup
    error_message = "The idle guard is on by default, with a 30-minute window, on the same node group."
  }
}

run "the_idle_guard_can_be_switched_off" {
  command = plan

  variables {
    idle_guard_minutes = null
    gpu_min_nodes      = 1
    gpu_desired_nodes  = 1
  }

  assert {
    condition     = module.gpu_nodegroup.idle_guard == null && contains(keys(module.ecr.repository_urls), "idle-guard")
    error_message = "idle_guard_minutes = null makes no guard role and lets gpu_min_nodes above 0; the platform's image repository stays (the etcd issuer runs from it)."
  }
}

run "the_idle_guard_refuses_a_floor_of_nodes" {
  command = plan

  variables {
    gpu_min_nodes     = 1
    gpu_desired_nodes = 1
  }

  expect_failures = [var.idle_guard_minutes]
}

run "p4d_changes_the_efa_count" {
  command = apply

  variables {
    gpu_instance_type = "p4d.24xlarge"
  }

  assert {
    condition     = output.efa_interfaces_per_node == 4
    error_message = "p4d.24xlarge has 4 EFA interfaces."
  }
}

run "emulator_switches_turn_off_unsupported_apis" {
  command = apply

  variables {
    enable_fsx             = false
    enable_placement_group = false
    enable_eks_addons      = false
    enable_access_entries  = false
    enable_pod_identity    = false
  }

  assert {
    condition     = output.fsx_file_system_id == null && length(module.eks.addons) == 0
    error_message = "Switches off FSx and add-ons."
  }
}

run "unknown_instance_type" {
  command = plan
  variables {
    gpu_instance_type = "p9.huge"
  }
  expect_failures = [var.gpu_instance_type]
}

run "az_not_in_region" {
  command = plan
  variables {
    gpu_availability_zone = "eu-west-1a"
  }
  expect_failures = [var.gpu_availability_zone]
}

run "fsx_size_not_an_increment" {
  command = plan
  variables {
    fsx_storage_capacity_gib = 3000
  }
  expect_failures = [var.fsx_storage_capacity_gib]
}

run "desired_above_max" {
  command = plan
  variables {
    gpu_desired_nodes = 4
    gpu_max_nodes     = 2
  }
  expect_failures = [var.gpu_desired_nodes]
}

run "az_names_the_region_does_not_have_fail_the_plan" {
  command = plan
  variables {
    availability_zones = ["us-east-1a", "us-east-1b", "us-east-1z"]
  }
  expect_failures = [terraform_data.availability_zones_exist]
}

run "az_name_that_only_looks_like_the_region" {
  command = plan
  variables {
    availability_zones    = ["us-east-1a", "us-east-12a"]
    gpu_availability_zone = "us-east-1a"
  }
  expect_failures = [terraform_data.availability_zones_exist]
}

run "api_open_to_the_internet_is_refused" {
  command = plan
  variables {
    public_access_cidrs = ["203.0.113.0/24", "0.0.0.0/0"]
  }
  expect_failures = [var.public_access_cidrs]
}

run "the_internet_in_two_halves_is_refused_too" {
  command = plan
  variables {
    public_access_cidrs = ["0.0.0.0/1", "128.0.0.0/1"]
  }
  expect_failures = [var.public_access_cidrs]
}

run "a_range_broader_than_a_16_is_refused" {
  command = plan
  variables {
    public_access_cidrs = ["203.0.113.0/24", "10.0.0.0/8"]
  }
  expect_failures = [var.public_access_cidrs]
}

run "an_ipv6_range_is_refused" {
  command = plan
  variables {
    public_access_cidrs = ["2001:db8::/48"]
  }
  expect_failures = [var.public_access_cidrs]
}

run "api_open_to_the_internet_with_the_opt_in" {
  command = plan
  variables {
    public_access_cidrs             = ["0.0.0.0/1", "128.0.0.0/1"]
    public_api_open_to_the_internet = true
  }
  assert {
    condition     = module.eks.endpoint_access.public && module.eks.endpoint_access.public_access_cidrs == toset(["0.0.0.0/1", "128.0.0.0/1"])
    error_message = "The explicit opt-in accepts ranges broader than /16, up to the whole internet, and the cluster gets them."
  }
}

run "the_cluster_takes_the_endpoint_and_submitter_choices" {
  command = plan
  variables {
    endpoint_public_access   = false
    public_access_cidrs      = []
    submitter_principal_arns = ["arn:aws:iam::123456789012:role/team-a"]
  }
  assert {
    condition     = !module.eks.endpoint_access.public && module.eks.endpoint_access.private
    error_message = "endpoint_public_access = false leaves the cluster with its private endpoint only."
  }
  assert {
    condition     = output.submitters.principal_arns == ["arn:aws:iam::123456789012:role/team-a"] && output.submitters.edit_namespaces == tolist(["trainkit-jobs"]) && output.submitters.kubernetes_group == "trainkit-submitters"
    error_message = "Submitters get access entries in the jobs' namespace; the platform stack reads their group from the outputs."
  }
}

run "the_data_job_reads_only_the_named_buckets" {
  command = plan

  variables {
    data_source_buckets = ["my-datasets", "imagenet.example"]
  }

  assert {
    condition = (
      module.eks.data_reader.association == [{ namespace = "trainkit-jobs", service_account = "trainkit-data" }]
    )
    error_message = "The data job's pod identity must be the jobs namespace's trainkit-data service account."
  }
  assert {
    condition = (
      module.eks.data_reader.bucket_arns == tolist(["arn:aws:s3:::my-datasets", "arn:aws:s3:::imagenet.example"])
    )
    error_message = "ListBucket must name exactly the configured buckets."
  }
  assert {
    condition     = output.data_reader.buckets == tolist(["my-datasets", "imagenet.example"])
    error_message = "The launcher reads the readable buckets from the outputs."
  }
}

run "no_buckets_no_data_role" {
  command = plan

  assert {
    condition     = length(module.eks.data_reader.association) == 0 && length(output.data_reader.buckets) == 0
    error_message = "Without data_source_buckets there is no data role."
  }
}

run "a_bucket_url_is_refused" {
  command = plan

  variables {
    data_source_buckets = ["s3://my-datasets/imagenet"]
  }

  expect_failures = [var.data_source_buckets]
}

run "sagemaker_is_off_by_default_and_creates_nothing" {
  command = plan

  assert {
    condition     = output.sagemaker == null && module.sagemaker.self_traffic == null
    error_message = "Without sagemaker_enabled the stack has no SageMaker part."
  }
  assert {
    condition     = length(aws_secretsmanager_secret.job_token) == 0
    error_message = "Neither SageMaker nor Batch: no token secret, the Hugging Face token's or the MLflow token's."
  }
}

run "sagemaker_part_is_private_encrypted_and_least_privilege" {
  command = apply

  variables {
    sagemaker_enabled   = true
    data_source_buckets = ["datasets"]
  }

  assert {
    condition     = jsonencode(output.sagemaker.subnet_ids) == jsonencode([module.network.gpu_subnet_id]) && length(output.sagemaker.security_group_ids) == 1
    error_message = "The jobs run in the GPU subnet with the SageMaker security group."
  }
  assert {
    condition     = startswith(output.sagemaker.role_arn, "arn:aws:iam::") && startswith(output.sagemaker.hf_token_secret_arn, "arn:aws:secretsmanager:")
    error_message = "The role and the token's secret are exported for the launcher."
  }
  # A self-hosted MLflow tracking server's bearer token (MLflow's client reads MLFLOW_TRACKING_TOKEN) has a secret of
  # its own, made with SageMaker alone, which the launcher gets.
  assert {
    condition     = contains(keys(aws_secretsmanager_secret.job_token), "mlflow-token") && output.sagemaker.mlflow_token_secret_arn == aws_secretsmanager_secret.job_token["mlflow-token"].arn && output.sagemaker.mlflow_token_secret_arn != output.sagemaker.hf_token_secret_arn
    error_message = "The MLflow token's secret is made with SageMaker alone and exported for the launcher."
  }
  assert {
    condition     = aws_secretsmanager_secret.job_token["mlflow-token"].kms_key_id == aws_kms_key.this.arn && aws_secretsmanager_secret.job_token["mlflow-token"].recovery_window_in_days == 0
    error_message = "The MLflow token's secret is encrypted with the stack's key and deleted at once by `make down`, like the Hugging Face token's."
  }
  assert {
    condition = alltrue([
      module.sagemaker.public_access_blocked,
      module.sagemaker.encryption.sse_algorithm == "aws:kms",
      module.sagemaker.encryption.kms_master_key_id == aws_kms_key.this.arn,
    ])
    error_message = "The runs bucket blocks public access and is encrypted with the stack's key."
  }
  assert {
    condition     = module.sagemaker.tls_only.effect == "Deny" && jsonencode(module.sagemaker.tls_only.values) == jsonencode(["false"])
    error_message = "The bucket policy denies requests without TLS."
  }
  assert {
    condition     = jsonencode(module.sagemaker.checkpoint_expiry) == jsonencode({ days = 30, prefix = "checkpoints/" })
    error_message = "Old checkpoints expire by the checkpoints/ prefix."
  }
  assert {
    condition     = module.sagemaker.self_traffic.ingress == module.sagemaker.self_traffic.group && module.sagemaker.self_traffic.egress == module.sagemaker.self_traffic.group
    error_message = "The instances of a job admit all traffic from their own security group (EFA)."
  }
  assert {
    condition     = jsonencode(module.sagemaker.trust) == jsonencode({ service = ["sagemaker.amazonaws.com"], source_account = ["123456789012"] })
    error_message = "Only SageMaker, acting for this account, assumes the role."
  }
  # The stack's key only through S3 (the bucket, the job's output) and Secrets Manager (the tokens): AWS KMS Developer
  # Guide, kms:ViaService. Reading a secret encrypted with a customer managed key needs kms:Decrypt on the key besides
  # secretsmanager:GetSecretValue (Secrets Manager User Guide, "Secret encryption and decryption in AWS Secrets
  # Manager"): DecryptTheToken covers both token secrets, which share the stack's key.
  assert {
    condition = alltrue([
      jsonencode(module.sagemaker.grant_conditions.UseTheStackKeyThroughS3) == jsonencode({ "kms:ViaService" = ["StringEquals", ["s3.us-east-1.amazonaws.com"]] }),
      jsonencode(module.sagemaker.grant_conditions.DecryptTheToken) == jsonencode({ "kms:ViaService" = ["StringEquals", ["secretsmanager.us-east-1.amazonaws.com"]] }),
      alltrue([for sid, actions in module.sagemaker.grant_actions : length(module.sagemaker.grant_conditions[sid]) > 0 if anytrue([for a in actions : startswith(a, "kms:")])]),
    ])
    error_message = "The role uses the stack's key only as S3 and Secrets Manager use it for it, never directly."
  }
  # Service Authorization Reference, Amazon EC2: the network-interface resource of these actions has ec2:Subnet.
  assert {
    condition = alltrue([
      jsonencode(module.sagemaker.grant_conditions.ManageInterfacesInTheSubnets) == jsonencode({ "ec2:Subnet" = ["ArnEquals", ["arn:aws:ec2:us-east-1:123456789012:subnet/subnet-0fffffffffffffff1"]] }),
      jsonencode(module.sagemaker.grant_conditions.RemoveInterfacePermissionsInTheSubnets) == jsonencode({ "ec2:Subnet" = ["ArnEqualsIfExists", ["arn:aws:ec2:us-east-1:123456789012:subnet/subnet-0fffffffffffffff1"]] }),
      contains(module.sagemaker.grants.CreateInterfacesInTheSubnets, "arn:aws:ec2:us-east-1:123456789012:subnet/subnet-0fffffffffffffff1"),
      length([for arn in module.sagemaker.grants.CreateInterfacesInTheSubnets : arn if strcontains(arn, ":subnet/")]) == 1,
    ])
    error_message = "The role creates, shares and deletes network interfaces in the GPU subnet only, not every interface of the account."
  }
  assert {
    condition     = output.sagemaker.kms_key_arn == aws_kms_key.this.arn && output.sagemaker.inter_container_traffic_encryption == false
    error_message = "The launcher gets the stack's key for the jobs' output and volumes; inter-container encryption is off unless asked."
  }
  assert {
    condition = alltrue([
      jsonencode(module.sagemaker.grants.ReadRuns) == jsonencode(["arn:aws:s3:::trainkit-runs-123456789012/checkpoints/*", "arn:aws:s3:::trainkit-runs-123456789012/datasets/*", "arn:aws:s3:::trainkit-runs-123456789012/runs/*"]),
      jsonencode(module.sagemaker.grants.WriteOutputsAndCheckpoints) == jsonencode(["arn:aws:s3:::trainkit-runs-123456789012/checkpoints/*", "arn:aws:s3:::trainkit-runs-123456789012/runs/*/output/*"]),
      jsonencode(module.sagemaker.grants.ReadDatasets) == jsonencode(["arn:aws:s3:::datasets", "arn:aws:s3:::datasets/*"]),
      jsonencode(module.sagemaker.grants.ReadTheToken) == jsonencode(sort([output.sagemaker.hf_token_secret_arn, output.sagemaker.mlflow_token_secret_arn])),
      contains(module.sagemaker.grants.ReadTheToken, "arn:aws:secretsmanager:us-east-1:123456789012:secret:trainkit-mlflow-token-GhIjKl"),
      jsonencode(module.sagemaker.grant_actions.ReadTheToken) == jsonencode(["secretsmanager:GetSecretValue"]),
      jsonencode(module.sagemaker.grants.DecryptTheToken) == jsonencode([aws_kms_key.this.arn]),
      jsonencode(module.sagemaker.grants.PullTheImage) == jsonencode(sort(distinct(values(module.ecr.repository_arns)))),
    ])
    error_message = "The role writes only outputs and checkpoints, reads only the named datasets, the tokens' secrets (the Hugging Face token's and the MLflow token's) and this stack's images."
  }
}

run "the_gpu_group_is_created_at_zero_nodes_by_default" {
  command = plan

  assert {
    condition     = module.gpu_nodegroup.node_groups["gpu"].desired_size == 0 && module.gpu_nodegroup.node_groups["gpu"].max_size == 2
    error_message = "`make up` creates the GPU node group empty (gpu_desired_nodes = 0) and waits for no p5 capacity; a job asks for nodes up to gpu_max_nodes."
  }
}
