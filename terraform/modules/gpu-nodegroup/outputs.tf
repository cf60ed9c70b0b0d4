################################################################################
# GPU node group
################################################################################

output "instance_types" {
  description = "The instance table (vCPUs, GPUs, GPU memory, EFA interfaces) this module uses."
  value       = local.instance_table
}

output "efa_interfaces" {
  description = "Per instance type of the table, its launch template's EFA interfaces card by card (network_card_index, device_index, interface_type)."
  value       = local.efa_interfaces
}

output "node_groups" {
  description = "Per node group: name, instance type, GPUs and EFA interfaces per node, max and initial desired nodes, placement group (null: none)."
  value = {
    for key, ng in local.node_groups : key => {
      name            = try(aws_eks_node_group.this[key].node_group_name, null)
      instance_type   = ng.instance_type
      gpus_per_node   = local.instance_table[ng.instance_type].gpus
      efa_per_node    = local.instance_table[ng.instance_type].efa_interfaces
      max_size        = ng.max_size
      desired_size    = ng.desired_size
      placement_group = try(local.placement_groups[key], null)
    }
  }
}

output "efa_security_group_id" {
  description = "Security group that lets GPU nodes reach each other over EFA."
  value       = try(aws_security_group.efa[0].id, null)
}

output "idle_guard" {
  description = "The idle guard's role ARN, namespace, service account and node group names; null when idle_guard is null."
  value = local.idle_guard ? {
    role_arn        = try(aws_iam_role.idle_guard[0].arn, null)
    namespace       = var.idle_guard.namespace
    service_account = var.idle_guard.service_account
    node_groups     = [for ng in aws_eks_node_group.this : ng.node_group_name]
  } : null
}
