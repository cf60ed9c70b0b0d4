################################################################################
# FSx for Lustre
################################################################################

resource "aws_security_group" "lustre" {
  count = var.create ? 1 : 0

  name_prefix = "${var.name}-lustre-"
  description = "FSx for Lustre: Lustre ports from the cluster's nodes only"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.name}-lustre" })
}

locals {
  # Lustre uses TCP 988 and 1018-1023 (FSx for Lustre user guide, "File system access control with
  # Amazon VPC"), from clients and between the file servers themselves.
  lustre_ports = { lnet = [988, 988], lustre = [1018, 1023] }
  sources      = var.create ? concat(var.client_security_group_ids, [aws_security_group.lustre[0].id]) : []
  ingress = {
    for pair in setproduct(keys(local.lustre_ports), range(length(local.sources))) :
    "${pair[0]}-${pair[1]}" => { ports = local.lustre_ports[pair[0]], source = local.sources[pair[1]] }
  }
}

resource "aws_vpc_security_group_ingress_rule" "lustre" {
  for_each = local.ingress

  security_group_id            = aws_security_group.lustre[0].id
  referenced_security_group_id = each.value.source
  ip_protocol                  = "tcp"
  from_port                    = each.value.ports[0]
  to_port                      = each.value.ports[1]
  description                  = "Lustre from cluster nodes and file servers"
}

# The clients' side (same guide, "Lustre client VPC security group rules"): each client group admits the Lustre
# ports from the file system's group, for the traffic the file servers start. Clients reach one another already: the
# EKS cluster group and the EFA group each admit all traffic from themselves.
locals {
  client_ingress = {
    for pair in setproduct(keys(local.lustre_ports), range(var.create ? length(var.client_security_group_ids) : 0)) :
    "${pair[0]}-${pair[1]}" => { ports = local.lustre_ports[pair[0]], client = var.client_security_group_ids[pair[1]] }
  }
}

resource "aws_vpc_security_group_ingress_rule" "client" {
  for_each = local.client_ingress

  security_group_id            = each.value.client
  referenced_security_group_id = aws_security_group.lustre[0].id
  ip_protocol                  = "tcp"
  from_port                    = each.value.ports[0]
  to_port                      = each.value.ports[1]
  description                  = "Lustre from FSx for Lustre file servers"
}

resource "aws_vpc_security_group_egress_rule" "lustre" {
  count = var.create ? 1 : 0

  security_group_id            = aws_security_group.lustre[0].id
  referenced_security_group_id = aws_security_group.lustre[0].id
  ip_protocol                  = "-1"
  description                  = "Between file servers"
}

resource "aws_fsx_lustre_file_system" "this" {
  count = var.create ? 1 : 0

  storage_capacity            = var.storage_capacity_gib
  deployment_type             = "PERSISTENT_2"
  per_unit_storage_throughput = var.throughput_per_tib
  subnet_ids                  = [var.subnet_id]
  security_group_ids          = [aws_security_group.lustre[0].id]
  kms_key_id                  = var.kms_key_arn
  data_compression_type       = "LZ4"
  file_system_type_version    = "2.15"
  tags                        = merge(var.tags, { Name = var.name })

  dynamic "root_squash_configuration" {
    for_each = var.root_squash == null ? [] : [var.root_squash]
    content {
      root_squash    = root_squash_configuration.value.uid_gid
      no_squash_nids = root_squash_configuration.value.no_squash_nids
    }
  }
}

locals {
  repository_events = concat(["NEW", "CHANGED"], var.sync_deletions ? ["DELETED"] : [])
}

resource "aws_fsx_data_repository_association" "s3" {
  count = var.create && var.s3_import_path != null ? 1 : 0

  file_system_id       = aws_fsx_lustre_file_system.this[0].id
  data_repository_path = var.s3_import_path
  file_system_path     = var.repository_mount_path

  # New and changed S3 objects appear in Lustre; files written under the path go back to S3. Deletions
  # travel only with sync_deletions: otherwise `rm -r` on the file system would delete the user's source
  # objects in S3 (and an object deleted in S3 would vanish from a running job's view).
  s3 {
    auto_import_policy {
      events = local.repository_events
    }
    auto_export_policy {
      events = local.repository_events
    }
  }

  tags = var.tags
}
