mock_provider "aws" {
  source = "../../tests/mocks"
}

variables {
  cluster_name              = "trainkit"
  node_role_arn             = "arn:aws:iam::123456789012:role/node"
  vpc_id                    = "vpc-0a1b2c3d4e5f60718"
  subnet_id                 = "subnet-0f9e8d7c6b5a40312"
  cluster_security_group_id = "sg-0c1a2b3c4d5e6f708"
  kms_key_arn               = "arn:aws:kms:us-east-1:123456789012:key/0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
}

run "p5_node_has_32_efa_interfaces_in_one_cluster_placement_group" {
  command = apply

  assert {
    condition     = length(aws_launch_template.this["gpu"].network_interfaces) == 32
    error_message = "A p5.48xlarge node must get all 32 EFA interfaces."
  }
  assert {
    condition     = [for ni in aws_launch_template.this["gpu"].network_interfaces : ni.interface_type if ni.network_card_index == 0] == ["efa"] && length([for ni in aws_launch_template.this["gpu"].network_interfaces : ni if ni.interface_type == "efa-only"]) == 31
    error_message = "p5: card 0 carries the efa primary interface, the other 31 cards efa-only."
  }
  assert {
    condition     = length(aws_placement_group.this) == 1 && aws_placement_group.this["gpu"].strategy == "cluster"
    error_message = "Each GPU node group gets one placement group of strategy cluster."
  }
  assert {
    condition     = aws_launch_template.this["gpu"].placement[0].group_name == aws_placement_group.this["gpu"].name
    error_message = "GPU nodes must launch into the placement group."
  }
  assert {
    condition     = alltrue([for ni in aws_launch_template.this["gpu"].network_interfaces : ni.subnet_id == var.subnet_id])
    error_message = "Every interface sits in the single GPU subnet."
  }
}

run "imdsv2_required_hop_limit_1_and_root_volume_encrypted" {
  command = apply

  assert {
    condition     = aws_launch_template.this["gpu"].metadata_options[0].http_tokens == "required"
    error_message = "IMDSv2 must be required on GPU nodes."
  }
  assert {
    condition     = aws_launch_template.this["gpu"].metadata_options[0].http_put_response_hop_limit == 1
    error_message = "Hop limit 1: training pods (their own network namespace) must not reach IMDS and the node role."
  }
  assert {
    condition     = aws_launch_template.this["gpu"].block_device_mappings[0].ebs[0].encrypted == "true" && aws_launch_template.this["gpu"].block_device_mappings[0].ebs[0].kms_key_id == var.kms_key_arn
    error_message = "Root volumes must be encrypted with the stack's KMS key."
  }
}

run "gpu_nodes_are_tainted_labelled_and_al2023_nvidia" {
  command = apply

  assert {
    condition     = aws_eks_node_group.this["gpu"].ami_type == "AL2023_x86_64_NVIDIA"
    error_message = "GPU nodes use the AL2023 NVIDIA AMI type."
  }
  assert {
    condition     = one(aws_eks_node_group.this["gpu"].taint).key == "nvidia.com/gpu" && one(aws_eks_node_group.this["gpu"].taint).effect == "NO_SCHEDULE"
    error_message = "GPU nodes carry the nvidia.com/gpu NoSchedule taint."
  }
  assert {
    condition     = aws_eks_node_group.this["gpu"].labels["trainkit/pool"] == "gpu"
    error_message = "Training pods select GPU nodes by the trainkit/pool=gpu label."
  }
}

run "no_ingress_from_anywhere" {
  command = apply

  assert {
    condition     = aws_vpc_security_group_ingress_rule.efa_self[0].cidr_ipv4 == null && aws_vpc_security_group_ingress_rule.efa_self[0].referenced_security_group_id == aws_security_group.efa[0].id
    error_message = "The EFA group only admits itself."
  }
}

run "p4d_gets_4_efa_interfaces" {
  command = apply

  variables {
    node_groups = { gpu = { instance_type = "p4d.24xlarge" } }
  }

  assert {
    condition     = length(aws_launch_template.this["gpu"].network_interfaces) == 4
    error_message = "A p4d.24xlarge node has 4 EFA interfaces."
  }
  assert {
    condition     = alltrue([for ni in aws_launch_template.this["gpu"].network_interfaces : ni.interface_type == "efa"])
    error_message = "p4d interfaces are all efa (efa-only is a P5 recommendation)."
  }
}

run "capacity_block_launches_into_its_reservation" {
  command = apply

  variables {
    node_groups = { gpu = { market = "capacity-block", capacity_reservation_id = "cr-0a1b2c3d4e5f60718" } }
  }

  assert {
    condition     = aws_launch_template.this["gpu"].instance_market_options[0].market_type == "capacity-block" && aws_eks_node_group.this["gpu"].capacity_type == "CAPACITY_BLOCK"
    error_message = "Capacity blocks use the capacity-block market."
  }
  assert {
    condition     = aws_launch_template.this["gpu"].capacity_reservation_specification[0].capacity_reservation_target[0].capacity_reservation_id == "cr-0a1b2c3d4e5f60718"
    error_message = "The reservation id reaches the launch template."
  }
}

run "unknown_instance_type_is_rejected" {
  command = plan

  variables {
    node_groups = { gpu = { instance_type = "p9.huge" } }
  }

  expect_failures = [var.node_groups]
}

run "desired_above_max_is_rejected" {
  command = plan

  variables {
    node_groups = { gpu = { desired_size = 4, max_size = 2 } }
  }

  expect_failures = [var.node_groups]
}

run "idle_guard_role_may_only_read_and_scale_its_node_group" {
  command = apply

  variables {
    idle_guard = {}
  }

  assert {
    condition     = toset(flatten([for s in data.aws_iam_policy_document.idle_guard[0].statement : s.actions])) == toset(["eks:DescribeNodegroup", "eks:UpdateNodegroupConfig"])
    error_message = "The idle guard may describe and update the node group's config, nothing else."
  }
  assert {
    condition     = alltrue([for s in data.aws_iam_policy_document.idle_guard[0].statement : toset(s.resources) == toset([aws_eks_node_group.this["gpu"].arn])])
    error_message = "Every statement of the idle guard's policy names only the GPU node group's ARN."
  }
  assert {
    condition     = aws_eks_pod_identity_association.idle_guard[0].namespace == "trainkit-system" && aws_eks_pod_identity_association.idle_guard[0].service_account == "trainkit-idle-guard"
    error_message = "The role goes to the platform stack's idle-guard service account."
  }
  assert {
    condition = jsonencode({ for c in one(data.aws_iam_policy_document.idle_guard_assume[0].statement).condition : c.variable => [c.test, c.values] }) == jsonencode({
      "aws:SourceAccount"                         = ["StringEquals", ["123456789012"]]
      "aws:RequestTag/eks-cluster-arn"            = ["StringEquals", ["arn:aws:eks:us-east-1:123456789012:cluster/trainkit"]]
      "aws:RequestTag/kubernetes-namespace"       = ["StringEquals", ["trainkit-system"]]
      "aws:RequestTag/kubernetes-service-account" = ["StringEquals", ["trainkit-idle-guard"]]
    })
    error_message = "Only EKS acting for this account assumes the role, and only for the guard's service account in this cluster."
  }
}

run "no_idle_guard_role_unless_asked" {
  command = plan

  assert {
    condition     = length(aws_iam_role.idle_guard) == 0 && output.idle_guard == null
    error_message = "The idle guard is opt-in."
  }
}
