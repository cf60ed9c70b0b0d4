################################################################################
# AWS Batch
################################################################################

output "batch" {
  description = "What trainkit's Batch backend reads (`--target batch`); null when not created."
  value = try({
    job_queue_arn           = aws_batch_job_queue.this[0].arn
    job_queue_name          = aws_batch_job_queue.this[0].name
    compute_environment_arn = aws_batch_compute_environment.this[0].arn
    job_role_arn            = aws_iam_role.job[0].arn
    execution_role_arn      = aws_iam_role.execution[0].arn
    instance_types          = local.instance_names
    fsx_mount_path          = var.fsx != null ? local.fsx_mount_path : null
    log_group               = local.log_group
    hf_token_secret_arn     = var.hf_token_secret_arn
    mlflow_token_secret_arn = var.mlflow_token_secret_arn
    max_nodes               = var.max_nodes
  }, null)
}

output "security_group_id" {
  description = "Security group of the instances and of their jobs' network interfaces."
  value       = try(aws_security_group.this[0].id, null)
}

# What the stack's tests check (terraform/stacks/infra/tests/batch.tftest.hcl): the settings as configured.

output "compute_environment" {
  description = "The compute environment's capacity settings."
  value = try({
    type                = aws_batch_compute_environment.this[0].type
    capacity            = aws_batch_compute_environment.this[0].compute_resources[0].type
    allocation_strategy = aws_batch_compute_environment.this[0].compute_resources[0].allocation_strategy
    min_vcpus           = aws_batch_compute_environment.this[0].compute_resources[0].min_vcpus
    max_vcpus           = aws_batch_compute_environment.this[0].compute_resources[0].max_vcpus
    instance_types      = sort(aws_batch_compute_environment.this[0].compute_resources[0].instance_type)
    subnets             = sort(aws_batch_compute_environment.this[0].compute_resources[0].subnets)
    security_group_ids  = sort(aws_batch_compute_environment.this[0].compute_resources[0].security_group_ids)
    placement_group     = aws_batch_compute_environment.this[0].compute_resources[0].placement_group
    placement_strategy  = try(aws_placement_group.this[0].strategy, null)
    instance_role       = aws_batch_compute_environment.this[0].compute_resources[0].instance_role
    launch_template     = one(aws_batch_compute_environment.this[0].compute_resources[0].launch_template).launch_template_id
    image_type          = one(aws_batch_compute_environment.this[0].compute_resources[0].ec2_configuration).image_type
    instance_tags       = aws_batch_compute_environment.this[0].compute_resources[0].tags
  }, null)
}

output "launch_template" {
  description = "The launch template: its id, network interfaces card by card, instance metadata options, root volume, user data (decoded)."
  value = try({
    id = aws_launch_template.this[0].id
    interfaces = [
      for ni in aws_launch_template.this[0].network_interfaces : {
        card            = ni.network_card_index
        device          = ni.device_index
        type            = ni.interface_type
        security_groups = sort(ni.security_groups)
      }
    ]
    metadata  = one(aws_launch_template.this[0].metadata_options)
    root      = one(one(aws_launch_template.this[0].block_device_mappings).ebs)
    user_data = base64decode(aws_launch_template.this[0].user_data)
  }, null)
}

output "job_queue" {
  description = "The job queue: its compute environments in order and its RUNNABLE time limits (reason => seconds)."
  value = try({
    compute_environments = [for ce in aws_batch_job_queue.this[0].compute_environment_order : ce.compute_environment]
    runnable_limits = {
      for limit in aws_batch_job_queue.this[0].job_state_time_limit_action :
      limit.reason => limit.max_time_seconds if limit.state == "RUNNABLE" && limit.action == "CANCEL"
    }
  }, null)
}

output "traffic" {
  description = "The security group, the groups its all-traffic rules admit, its rules to anywhere and the Lustre rules (port ranges)."
  value = try({
    group         = aws_security_group.this[0].id
    ingress       = aws_vpc_security_group_ingress_rule.self[0].referenced_security_group_id
    egress        = aws_vpc_security_group_egress_rule.self[0].referenced_security_group_id
    open_egress   = ["${aws_vpc_security_group_egress_rule.https[0].cidr_ipv4}:${aws_vpc_security_group_egress_rule.https[0].from_port}-${aws_vpc_security_group_egress_rule.https[0].to_port}"]
    lustre_out    = sort([for rule in aws_vpc_security_group_egress_rule.lustre : "${rule.referenced_security_group_id}:${rule.from_port}-${rule.to_port}"])
    lustre_in     = sort([for rule in aws_vpc_security_group_ingress_rule.lustre : "${rule.referenced_security_group_id}:${rule.from_port}-${rule.to_port}"])
    fsx_admits_us = sort([for rule in aws_vpc_security_group_ingress_rule.fsx_from_batch : "${rule.security_group_id}<-${rule.referenced_security_group_id}:${rule.from_port}-${rule.to_port}"])
  }, null)
}

output "trust" {
  description = "Who may assume the execution and job roles (the service, the source account), and the instance role."
  value = {
    task = {
      service        = tolist(one(one(data.aws_iam_policy_document.task_trust.statement).principals).identifiers)
      source_account = tolist(one(one(data.aws_iam_policy_document.task_trust.statement).condition).values)
    }
    instance = tolist(one(one(data.aws_iam_policy_document.instance_trust.statement).principals).identifiers)
  }
}

output "execution_grants" {
  description = "The execution role's statements: sid => { actions, resources } (sorted)."
  value = {
    for statement in data.aws_iam_policy_document.execution.statement :
    statement.sid => { actions = sort(statement.actions), resources = sort(statement.resources) }
  }
}

output "job_grants" {
  description = "The job role's statements: sid => { actions, resources } (sorted); empty: the role holds no policy."
  value = {
    for statement in coalesce(data.aws_iam_policy_document.job.statement, []) :
    statement.sid => { actions = sort(statement.actions), resources = sort(statement.resources) }
  }
}

output "role_policies" {
  description = "Which role holds which policies: execution and job (inline policy names), instance (managed policy ARNs)."
  value = {
    execution = [for policy in aws_iam_role_policy.execution : policy.name]
    job       = [for policy in aws_iam_role_policy.job : policy.name]
    instance  = [for attachment in aws_iam_role_policy_attachment.instance : attachment.policy_arn]
  }
}

output "mlflow_policy" {
  description = "The MLflow client policy attached to the job role; null when the role has none."
  value       = var.create && var.mlflow_enabled ? aws_iam_role_policy.mlflow[0].policy : null
}
