mock_provider "aws" {
  source = "../../tests/mocks"

  # Computed attributes the module leaves unset read as empty here, so a run tells "not sent" from "sent".
  mock_resource "aws_eks_node_group" {
    defaults = { instance_types = [], disk_size = 0 }
  }
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
    condition     = aws_eks_node_group.this["gpu"].subnet_ids == toset([var.subnet_id])
    error_message = "The node group's subnet_ids place every node in the single GPU subnet (the launch template names no subnet)."
  }
}

# EKS's rules for a managed node group with a launch template, checked on every variant at once (on-demand p5, p4d,
# capacity block). Sources:
#   [API] EKS API Reference, LaunchTemplateSpecification and CreateNodegroup (subnets, diskSize, instanceTypes,
#         remoteAccess): https://docs.aws.amazon.com/eks/latest/APIReference/API_LaunchTemplateSpecification.html,
#         https://docs.aws.amazon.com/eks/latest/APIReference/API_CreateNodegroup.html
#   [LT]  EKS User Guide, "Customize managed nodes with launch templates", Launch template configuration basics and
#         Using custom security groups: https://docs.aws.amazon.com/eks/latest/userguide/launch-templates.html
#   [CB]  EKS User Guide, "Create a managed node group with Capacity Blocks for ML":
#         https://docs.aws.amazon.com/eks/latest/userguide/capacity-blocks-mng.html
run "every_launch_template_obeys_the_eks_launch_template_rules" {
  command = apply

  variables {
    node_groups = {
      gpu  = {}
      p4d  = { instance_type = "p4d.24xlarge" }
      cb   = { market = "capacity-block", capacity_reservation_id = "cr-0a1b2c3d4e5f60718" }
      odcr = { capacity_reservation_id = "cr-0f1e2d3c4b5a60718", placement_group_name = "reserved-pg" }
    }
  }

  # [API] CreateNodegroup subnets: "If you specify launchTemplate, then don't specify SubnetId in your launch
  # template, or the node group deployment will fail." [LT] prohibits "Subnet under Network interfaces".
  assert {
    condition     = alltrue(flatten([for lt in aws_launch_template.this : [for ni in lt.network_interfaces : ni.subnet_id == null]]))
    error_message = "No network interface of a node group's launch template may name a subnet: the node group's subnet_ids place the nodes ([API] CreateNodegroup, [LT])."
  }
  # [API] LaunchTemplateSpecification: no IamInstanceProfile; [LT]: "IAM instance profile" is prohibited, the node
  # group's node role takes its place.
  assert {
    condition     = alltrue([for lt in aws_launch_template.this : length(lt.iam_instance_profile) == 0])
    error_message = "A node group's launch template must not set an IAM instance profile: EKS uses node_role_arn ([API] LaunchTemplateSpecification, [LT])."
  }
  # [API] LaunchTemplateSpecification: no RequestSpotInstances (capacity_type SPOT on the node group instead).
  assert {
    condition     = alltrue([for lt in aws_launch_template.this : alltrue([for m in lt.instance_market_options : m.market_type != "spot"])])
    error_message = "A node group's launch template must not request Spot Instances: Spot is the node group's capacity_type ([API] LaunchTemplateSpecification)."
  }
  # [API] LaunchTemplateSpecification: no HibernationOptions, no TerminateInstances; [LT]: leave "Shutdown behavior"
  # and "Stop - Hibernate behavior" out of the launch template, EKS controls the instance lifecycle.
  assert {
    condition     = alltrue([for lt in aws_launch_template.this : length(lt.hibernation_options) == 0 && lt.instance_initiated_shutdown_behavior == null])
    error_message = "A node group's launch template must leave shutdown and hibernate behaviour unset ([API] LaunchTemplateSpecification, [LT])."
  }
  # [API] CreateNodegroup: with launchTemplate, don't specify diskSize or remoteAccess; [LT]: disk size and SSH key
  # go in the launch template.
  assert {
    condition     = alltrue([for ng in aws_eks_node_group.this : ng.disk_size == 0 && length(ng.remote_access) == 0])
    error_message = "A node group with a launch template must not set disk_size or remote_access ([API] CreateNodegroup, [LT])."
  }
  # [LT] Note: zero or one instance type in the launch template; if it has one, the node group may name none.
  assert {
    condition     = alltrue([for k, lt in aws_launch_template.this : lt.instance_type == null || length(aws_eks_node_group.this[k].instance_types) == 0])
    error_message = "An instance type goes in the launch template or in the node group's instance_types, never both ([LT])."
  }
  # [LT] Only with a custom AMI (image_id in the launch template) is ami_type prohibited; these templates have none.
  assert {
    condition     = alltrue([for k, lt in aws_launch_template.this : lt.image_id == null && aws_eks_node_group.this[k].ami_type == "AL2023_x86_64_NVIDIA"])
    error_message = "No custom AMI in the launch template, so the node group picks the AL2023 NVIDIA AMI type ([LT])."
  }
  # [LT] Using custom security groups: instance-level or network-interface security groups, not both.
  assert {
    condition     = alltrue([for lt in aws_launch_template.this : length(coalesce(lt.vpc_security_group_ids, [])) == 0 || alltrue([for ni in lt.network_interfaces : length(coalesce(ni.security_groups, [])) == 0])])
    error_message = "Security groups go on the instance or on the network interfaces of a launch template, not both ([LT])."
  }
  # [CB] A capacity-block node group: capacity type CAPACITY_BLOCK, and its launch template has the capacity-block
  # market, the reservation and the instance type, "or the create request will be rejected".
  assert {
    condition = alltrue([for k, ng in aws_eks_node_group.this : ng.capacity_type != "CAPACITY_BLOCK" ? true : (
      one(aws_launch_template.this[k].instance_market_options).market_type == "capacity-block"
      && one(one(aws_launch_template.this[k].capacity_reservation_specification).capacity_reservation_target).capacity_reservation_id != null
      && aws_launch_template.this[k].instance_type != null
    )])
    error_message = "A capacity-block launch template needs market type capacity-block, the reservation id and the instance type ([CB])."
  }
}

run "imdsv2_required_hop_limit_1_root_volume_encrypted_memlock_raised" {
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
    condition     = strcontains(base64decode(aws_launch_template.this["gpu"].user_data), "Content-Type: application/node.eks.aws\r\n\r\n${file("nodeconfig.yaml")}\r\n--trainkit-nodeconfig--")
    error_message = "The user data carries nodeconfig.yaml (the containers' memlock limit) as EKS's NodeConfig MIME part."
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

  # A key of its own: earlier runs' state holds group "gpu" with its instance_types.
  variables {
    node_groups = { cb = { market = "capacity-block", capacity_reservation_id = "cr-0a1b2c3d4e5f60718" } }
  }

  assert {
    condition     = aws_launch_template.this["cb"].instance_market_options[0].market_type == "capacity-block" && aws_eks_node_group.this["cb"].capacity_type == "CAPACITY_BLOCK"
    error_message = "Capacity blocks use the capacity-block market."
  }
  assert {
    condition     = aws_launch_template.this["cb"].capacity_reservation_specification[0].capacity_reservation_target[0].capacity_reservation_id == "cr-0a1b2c3d4e5f60718"
    error_message = "The reservation id reaches the launch template."
  }
  assert {
    condition     = aws_launch_template.this["cb"].instance_type == "p5.48xlarge" && length(aws_eks_node_group.this["cb"].instance_types) == 0
    error_message = "A capacity block takes its instance type from the launch template only; the node group sends no instance_types."
  }
  assert {
    condition     = length(aws_placement_group.this) == 0 && length(aws_launch_template.this["cb"].placement) == 0 && output.node_groups["cb"].placement_group == null
    error_message = "A reservation made outside this module's placement group gets no new cluster placement group."
  }
}

run "reservation_launches_into_the_placement_group_it_names" {
  command = apply

  variables {
    node_groups = { gpu = { capacity_reservation_id = "cr-0a1b2c3d4e5f60718", placement_group_name = "reserved-pg" } }
  }

  assert {
    condition     = length(aws_placement_group.this) == 0 && aws_launch_template.this["gpu"].placement[0].group_name == "reserved-pg" && output.node_groups["gpu"].placement_group == "reserved-pg"
    error_message = "A reservation made in a cluster placement group launches into that group, and no new one is created."
  }
  assert {
    condition     = aws_launch_template.this["gpu"].instance_type == null && aws_eks_node_group.this["gpu"].instance_types == tolist(["p5.48xlarge"]) && aws_eks_node_group.this["gpu"].capacity_type == "ON_DEMAND"
    error_message = "An on-demand capacity reservation keeps the instance type on the node group."
  }
}

run "created_at_zero_nodes_and_updated_without_more_unavailable_than_one" {
  command = apply

  assert {
    condition     = aws_eks_node_group.this["gpu"].scaling_config[0].desired_size == 0 && aws_eks_node_group.this["gpu"].scaling_config[0].min_size == 0
    error_message = "The GPU group is created at 0 nodes: `make up` does not wait for p5 capacity; the launcher or the idle guard asks for nodes."
  }
  assert {
    condition     = aws_eks_node_group.this["gpu"].update_config[0].max_unavailable == 1
    error_message = "A rolling update replaces at most one GPU node at a time."
  }
}

run "instances_volumes_and_interfaces_carry_the_stack_tags" {
  command = apply

  variables {
    tags = { "trainkit:stack-id" = "trainkit-test" }
  }

  assert {
    condition     = toset([for ts in aws_launch_template.this["gpu"].tag_specifications : ts.resource_type if ts.tags["trainkit:stack-id"] == "trainkit-test"]) == toset(["instance", "volume", "network-interface"])
    error_message = "Instances, their root volumes and their EFA interfaces carry the stack's tags (invoke infra.audit finds them)."
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
    error_message = "The module makes no guard role unless its caller asks (the infra stack does by default)."
  }
}
