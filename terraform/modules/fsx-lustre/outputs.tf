################################################################################
# FSx for Lustre
################################################################################

output "file_system_id" {
  description = "FSx file system id (fs-...)."
  value       = try(aws_fsx_lustre_file_system.this[0].id, null)
}

output "dns_name" {
  description = "DNS name to mount."
  value       = try(aws_fsx_lustre_file_system.this[0].dns_name, null)
}

output "mount_name" {
  description = "Lustre mount name (the PV's volumeAttributes.mountname)."
  value       = try(aws_fsx_lustre_file_system.this[0].mount_name, null)
}

output "security_group_id" {
  description = "Security group of the file system."
  value       = try(aws_security_group.lustre[0].id, null)
}

output "subnet_id" {
  description = "Subnet of the file system (the GPU subnet)."
  value       = try(aws_fsx_lustre_file_system.this[0].subnet_ids[0], null)
}

output "kms_key_id" {
  description = "KMS key that encrypts the file system."
  value       = try(aws_fsx_lustre_file_system.this[0].kms_key_id, null)
}

output "lustre_ports" {
  description = "TCP port ranges a Lustre client reaches the file system on ({ name = [from, to] }); clients outside client_security_group_ids open them with this group."
  value       = local.lustre_ports
}

output "root_squash" {
  description = "The file system's root squash (root_squash, no_squash_nids), or null when off."
  value       = try(one(aws_fsx_lustre_file_system.this[0].root_squash_configuration), null)
}
