################################################################################
# Network
################################################################################

output "vpc_id" {
  description = "VPC id."
  value       = try(aws_vpc.this[0].id, null)
}

output "vpc_cidr" {
  description = "VPC IPv4 CIDR."
  value       = try(aws_vpc.this[0].cidr_block, null)
}

output "private_subnet_ids" {
  description = "Private subnets, one per AZ (system nodes, EKS control-plane ENIs)."
  value       = aws_subnet.private[*].id
}

output "private_subnet_cidrs" {
  description = "The private subnets' IPv4 CIDRs (the system nodes' addresses: FSx spares them its root squash)."
  value       = aws_subnet.private[*].cidr_block
}

output "public_subnet_ids" {
  description = "Public subnets, one per AZ."
  value       = aws_subnet.public[*].id
}

output "gpu_subnet_id" {
  description = "The GPU subnet (GPU nodes and FSx for Lustre)."
  value       = try(aws_subnet.gpu[0].id, null)
}

output "gpu_az" {
  description = "Availability zone of the GPU subnet."
  value       = try(aws_subnet.gpu[0].availability_zone, null)
}

output "private_route_table_id" {
  description = "Route table of the private and GPU subnets."
  value       = try(aws_route_table.private[0].id, null)
}
