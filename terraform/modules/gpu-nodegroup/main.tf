################################################################################
# GPU node group
#
# One launch template per node group with every EFA interface its instance type offers, one
# cluster placement group per node group (none for a capacity reservation unless it names its own),
# all in the single GPU subnet.
################################################################################

locals {
  instance_table = { for k, v in jsondecode(file("${path.module}/instance_types.json")) : k => v if !startswith(k, "_") }
  node_groups    = var.create ? var.node_groups : {}

  # Network card 0 carries the primary interface (ENA + EFA). P5 family: the other cards get
  # efa-only interfaces (no IP address consumed); earlier types get full efa interfaces. One layout per
  # instance type, also given to the batch module (output efa_interfaces).
  efa_interfaces = {
    for type, spec in local.instance_table : type => [
      for card in range(spec.efa_interfaces) : {
        network_card_index = card
        device_index       = card == 0 ? 0 : 1
        interface_type     = card == 0 || !spec.efa_only_secondary ? "efa" : "efa-only"
      }
    ]
  }
  interfaces    = { for key, ng in local.node_groups : key => local.efa_interfaces[ng.instance_type] }
  mime_boundary = "trainkit-nodeconfig"

  # A reservation holds capacity where it was made: a new cluster placement group around it can fail to launch
  # although the reservation has room (aws-parallelcluster's PlacementGroupCapacityReservationValidator), so a node
  # group with a reservation launches into the placement group it names, or none.
  new_placement_groups = {
    for key, ng in local.node_groups : key => ng
    if var.enable_placement_group && ng.placement_group_name == null && ng.capacity_reservation_id == null
  }
  placement_groups = {
    for key, ng in local.node_groups : key => coalesce(ng.placement_group_name, try(aws_placement_group.this[key].name, null))
    if ng.placement_group_name != null || contains(keys(local.new_placement_groups), key)
  }
}

resource "aws_security_group" "efa" {
  count = var.create ? 1 : 0

  name_prefix = "${var.cluster_name}-efa-"
  description = "EFA: all traffic between GPU nodes (EFA requires a self-referencing rule)"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.cluster_name}-efa" })
}

resource "aws_vpc_security_group_ingress_rule" "efa_self" {
  count = var.create ? 1 : 0

  security_group_id            = aws_security_group.efa[0].id
  referenced_security_group_id = aws_security_group.efa[0].id
  ip_protocol                  = "-1"
  description                  = "All traffic from other GPU nodes (EFA, NCCL)"
}

resource "aws_vpc_security_group_egress_rule" "efa_self" {
  count = var.create ? 1 : 0

  security_group_id            = aws_security_group.efa[0].id
  referenced_security_group_id = aws_security_group.efa[0].id
  ip_protocol                  = "-1"
  description                  = "All traffic to other GPU nodes (EFA, NCCL)"
}

resource "aws_placement_group" "this" {
  for_each = local.new_placement_groups

  name     = "${var.cluster_name}-${coalesce(each.value.name, each.key)}"
  strategy = "cluster"
  tags     = var.tags
}

resource "aws_launch_template" "this" {
  for_each = local.node_groups

  name_prefix = "${var.cluster_name}-${coalesce(each.value.name, each.key)}-"

  # EKS takes a capacity block's instance type from the launch template only (EKS User Guide, "Create a managed
  # node group with Capacity Blocks for ML"); otherwise it stays on the node group.
  instance_type = each.value.market == "capacity-block" ? each.value.instance_type : null

  # No subnet_id: the node group's subnet_ids place the nodes, and EKS fails a node group whose launch template
  # names a subnet (CreateNodegroup API reference; tests/gpu_nodegroup.tftest.hcl checks EKS's launch template rules).
  dynamic "network_interfaces" {
    for_each = local.interfaces[each.key]
    content {
      network_card_index    = network_interfaces.value.network_card_index
      device_index          = network_interfaces.value.device_index
      interface_type        = network_interfaces.value.interface_type
      security_groups       = [var.cluster_security_group_id, aws_security_group.efa[0].id]
      delete_on_termination = true
    }
  }

  # The containers' memlock limit (nodeconfig.yaml says why), as a MIME part EKS merges with its own NodeConfig.
  user_data = base64encode(join("\r\n", [
    "MIME-Version: 1.0",
    "Content-Type: multipart/mixed; boundary=\"${local.mime_boundary}\"",
    "",
    "--${local.mime_boundary}",
    "Content-Type: application/node.eks.aws",
    "",
    file("${path.module}/nodeconfig.yaml"),
    "--${local.mime_boundary}--",
    "",
  ]))

  metadata_options {
    http_endpoint = "enabled"
    http_tokens   = "required" # IMDSv2 only
    # Hop limit 1: a pod in its own network namespace (one hop further) cannot reach IMDS, so training
    # pods cannot borrow the node role (nothing in them needs AWS credentials: data comes over FSx).
    # What does need IMDS runs with hostNetwork (no extra hop): aws-node (VPC CNI: its ENI layout; its
    # credentials come from its own Pod Identity role, terraform/modules/eks), kube-proxy, the EKS Pod Identity
    # agent. The FSx CSI node plugin does not (its chart dropped
    # hostNetwork in 1.6.1): it makes no AWS call, and when IMDS does not answer it reads its
    # instance id and zone from its Node's providerID through the Kubernetes API. The NVIDIA and EFA
    # device plugins and dcgm-exporter read only the node's devices.
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = each.value.root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      kms_key_id            = var.kms_key_arn
      delete_on_termination = true
    }
  }

  dynamic "placement" {
    for_each = contains(keys(local.placement_groups), each.key) ? [local.placement_groups[each.key]] : []
    content {
      group_name = placement.value
    }
  }

  dynamic "capacity_reservation_specification" {
    for_each = each.value.capacity_reservation_id != null ? [1] : []
    content {
      capacity_reservation_target {
        capacity_reservation_id = each.value.capacity_reservation_id
      }
    }
  }

  dynamic "instance_market_options" {
    for_each = each.value.market == "capacity-block" ? [1] : []
    content {
      market_type = "capacity-block"
    }
  }

  # The instances, their root volumes and their EFA interfaces carry the stack's tags, so `invoke infra.audit`
  # finds whatever outlives the stack.
  dynamic "tag_specifications" {
    for_each = ["instance", "volume", "network-interface"]
    content {
      resource_type = tag_specifications.value
      tags          = merge(var.tags, { Name = "${var.cluster_name}-${coalesce(each.value.name, each.key)}" })
    }
  }

  tags = var.tags
}

resource "aws_eks_node_group" "this" {
  for_each = local.node_groups

  cluster_name    = var.cluster_name
  node_group_name = coalesce(each.value.name, each.key)
  node_role_arn   = var.node_role_arn
  subnet_ids      = [var.subnet_id]
  ami_type        = "AL2023_x86_64_NVIDIA"
  instance_types  = each.value.market == "capacity-block" ? null : [each.value.instance_type]
  capacity_type   = each.value.market == "capacity-block" ? "CAPACITY_BLOCK" : "ON_DEMAND"

  launch_template {
    id      = aws_launch_template.this[each.key].id
    version = aws_launch_template.this[each.key].latest_version
  }

  scaling_config {
    min_size     = each.value.min_size
    desired_size = each.value.desired_size
    max_size     = each.value.max_size
  }

  # Training pods select on these labels and tolerate the taint; nothing else lands on GPUs.
  labels = merge(each.value.labels, {
    "trainkit/pool"                 = "gpu"
    "trainkit/node-group"           = coalesce(each.value.name, each.key)
    "vpc.amazonaws.com/efa.present" = "true"
  })

  taint {
    key    = "nvidia.com/gpu"
    value  = "true"
    effect = "NO_SCHEDULE"
  }

  # One node at a time. This does not avoid surge: EKS's default update strategy first launches up to twice the
  # number of AZs in new nodes (2 here), and the MINIMAL strategy that does not needs aws provider >= 6.26. So a
  # launch template change needs the group at 0 nodes first (README, "Changing the launch template").
  update_config {
    max_unavailable = 1
  }

  # The idle guard and `invoke train --target eks` set the desired size (to zero and back); a later
  # `make up` must not undo either. min_size and max_size stay Terraform's.
  lifecycle {
    ignore_changes = [scaling_config[0].desired_size]
  }

  tags = var.tags
}

################################################################################
# Idle guard identity (EKS Pod Identity)
#
# The platform stack's idle-guard CronJob runs as idle_guard.service_account; its role may read and set
# the scaling config of these node groups and nothing else, and only that service account of this cluster may
# assume it (tests/unit/test_idle_guard_policy.py).
################################################################################

data "aws_partition" "current" {}
data "aws_region" "current" {}
data "aws_caller_identity" "current" {}

locals {
  idle_guard = var.create && var.idle_guard != null
  account    = data.aws_caller_identity.current.account_id
  # The cluster's ARN as Pod Identity's eks-cluster-arn session tag carries it.
  cluster_arn = "arn:${data.aws_partition.current.partition}:eks:${data.aws_region.current.name}:${local.account}:cluster/${var.cluster_name}"
}

data "aws_iam_policy_document" "idle_guard_assume" {
  count = local.idle_guard ? 1 : 0

  statement {
    actions = ["sts:AssumeRole", "sts:TagSession"]
    principals {
      type        = "Service"
      identifiers = ["pods.eks.amazonaws.com"]
    }
    # Confused deputy: only EKS acting for this account (IAM User Guide, "The confused deputy problem"; the EKS Best
    # Practices Guide's Pod Identity trust policy, Security > IAM, checks aws:SourceOrgId, the same check by
    # organisation, which an account outside AWS Organizations lacks).
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account]
    }
    # And only for the guard's service account in this cluster, from the session tags Pod Identity sends (EKS User
    # Guide, "Create IAM role with trust policy required by EKS Pod Identity", Setting Conditions).
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/eks-cluster-arn"
      values   = [local.cluster_arn]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/kubernetes-namespace"
      values   = [var.idle_guard.namespace]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/kubernetes-service-account"
      values   = [var.idle_guard.service_account]
    }
  }
}

data "aws_iam_policy_document" "idle_guard" {
  count = local.idle_guard ? 1 : 0

  statement {
    sid       = "ReadNodeGroup"
    actions   = ["eks:DescribeNodegroup"]
    resources = [for ng in aws_eks_node_group.this : ng.arn]
  }
  statement {
    sid       = "ScaleNodeGroup"
    actions   = ["eks:UpdateNodegroupConfig"]
    resources = [for ng in aws_eks_node_group.this : ng.arn]
  }
}

resource "aws_iam_role" "idle_guard" {
  count = local.idle_guard ? 1 : 0

  name_prefix        = "${substr(var.cluster_name, 0, 24)}-idle-"
  assume_role_policy = data.aws_iam_policy_document.idle_guard_assume[0].json
  tags               = var.tags
}

resource "aws_iam_role_policy" "idle_guard" {
  count = local.idle_guard ? 1 : 0

  role   = aws_iam_role.idle_guard[0].id
  policy = data.aws_iam_policy_document.idle_guard[0].json
}

resource "aws_eks_pod_identity_association" "idle_guard" {
  count = local.idle_guard ? 1 : 0

  cluster_name    = var.cluster_name
  namespace       = var.idle_guard.namespace
  service_account = var.idle_guard.service_account
  role_arn        = aws_iam_role.idle_guard[0].arn
  tags            = var.tags
}
