mock_provider "aws" {
  source = "../../tests/mocks"
}

# Distinct ARNs for the VPC CNI's role and the cluster during plan, so "the VPC CNI runs as its own role" cannot pass on the
# mocks' one shared role ARN.
override_resource {
  target          = aws_iam_role.vpc_cni
  override_during = plan
  values          = { arn = "arn:aws:iam::123456789012:role/trainkit-vpc-cni", name = "trainkit-vpc-cni" }
}
override_resource {
  target          = aws_eks_cluster.this
  override_during = plan
  values          = { name = "trainkit", arn = "arn:aws:eks:us-east-1:123456789012:cluster/trainkit" }
}

variables {
  name                = "trainkit"
  vpc_id              = "vpc-0a1b2c3d4e5f60718"
  subnet_ids          = ["subnet-0a1b2c3d4e5f60718", "subnet-0fffffffffffffff1"]
  public_access_cidrs = ["203.0.113.0/24"]
  kms_key_arn         = "arn:aws:kms:us-east-1:123456789012:key/0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
  tags                = { "trainkit:stack-id" = "trainkit-test", owner = "ci@example.com" }
}

run "system_nodes_keep_pods_off_imds_and_carry_the_stack_tags" {
  command = plan

  # EKS User Guide, "Amazon EKS security best practices": IMDSv2 required with hop limit 1 blocks IMDS for every
  # container that doesn't use host networking.
  assert {
    condition     = aws_launch_template.system[0].metadata_options[0].http_tokens == "required" && aws_launch_template.system[0].metadata_options[0].http_put_response_hop_limit == 1
    error_message = "System nodes: IMDSv2 only, hop limit 1, so Grafana, Prometheus, etcd, the operator and the data job cannot read the node role."
  }

  assert {
    condition     = toset([for spec in aws_launch_template.system[0].tag_specifications : spec.resource_type]) == toset(["instance", "volume", "network-interface"])
    error_message = "The system node group's instances, root volumes and network interfaces are tagged at launch (what the audit finds them by)."
  }
  assert {
    condition     = alltrue([for spec in aws_launch_template.system[0].tag_specifications : spec.tags["trainkit:stack-id"] == "trainkit-test" && spec.tags.Name == "trainkit-system"])
    error_message = "Each carries the stack id and the node group's Name."
  }
}

run "the_vpc_cni_has_its_own_role_and_every_pod_identity_trusts_only_this_account" {
  command = plan

  variables {
    data_reader = { buckets = ["my-datasets"] }
  }

  assert {
    condition     = toset(keys(data.aws_iam_policy_document.pod_identity_assume)) == toset(["vpc_cni", "fsx_csi", "ebs_csi", "data_reader"])
    error_message = "The VPC CNI, the FSx and EBS CSI controllers and the data job each have a Pod Identity role."
  }
  # EKS User Guide, "Use Kubernetes volume storage with Amazon EBS": the managed policy, and grants on a customer
  # managed key only for AWS resources.
  assert {
    condition = (
      aws_iam_role_policy_attachment.ebs_csi[0].policy_arn == "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
      && aws_eks_pod_identity_association.ebs_csi[0].service_account == "ebs-csi-controller-sa"
      && aws_eks_pod_identity_association.ebs_csi[0].namespace == "kube-system"
      && contains(keys(aws_eks_addon.this), "aws-ebs-csi-driver")
      && jsonencode([for st in data.aws_iam_policy_document.ebs_csi_kms.statement : st.resources]) == jsonencode([[var.kms_key_arn], [var.kms_key_arn]])
      && one(data.aws_iam_policy_document.ebs_csi_kms.statement[0].condition).variable == "kms:GrantIsForAWSResource"
    )
    error_message = "The EBS CSI add-on's controller has its own role: AmazonEBSCSIDriverPolicy, and the stack's key through grants for AWS resources only."
  }
  # EKS User Guide, "Create IAM role with trust policy required by EKS Pod Identity"; IAM User Guide, "The confused
  # deputy problem".
  assert {
    condition = alltrue([for name, document in data.aws_iam_policy_document.pod_identity_assume : (
      toset(one(document.statement).actions) == toset(["sts:AssumeRole", "sts:TagSession"])
      && jsonencode({ for c in one(document.statement).condition : c.variable => [c.test, c.values] }) == jsonencode({
        "aws:SourceAccount"                         = ["StringEquals", ["123456789012"]]
        "aws:RequestTag/eks-cluster-arn"            = ["StringEquals", ["arn:aws:eks:us-east-1:123456789012:cluster/trainkit"]]
        "aws:RequestTag/kubernetes-namespace"       = ["StringEquals", [local.pod_identities[name].namespace]]
        "aws:RequestTag/kubernetes-service-account" = ["StringEquals", [local.pod_identities[name].service_account]]
      })
    )])
    error_message = "Each Pod Identity role trusts only EKS acting for this account (aws:SourceAccount), for its own service account in this cluster."
  }
  assert {
    condition     = [for a in aws_eks_addon.before_nodes["vpc-cni"].pod_identity_association : [a.service_account, a.role_arn]] == [["aws-node", "arn:aws:iam::123456789012:role/trainkit-vpc-cni"]]
    error_message = "The vpc-cni add-on associates its aws-node service account with the VPC CNI's own role."
  }
  assert {
    condition     = aws_iam_role_policy_attachment.vpc_cni[0].policy_arn == "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy" && aws_iam_role_policy_attachment.vpc_cni[0].role == "trainkit-vpc-cni"
    error_message = "AmazonEKS_CNI_Policy goes to the VPC CNI's role."
  }
  assert {
    condition     = toset(keys(aws_iam_role_policy_attachment.node)) == toset(["AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly"])
    error_message = "The node role keeps only what the kubelet and the Pod Identity agent need: no AmazonEKS_CNI_Policy (any ENI in the account) for what reaches IMDS."
  }
  assert {
    condition     = toset(keys(aws_eks_addon.before_nodes)) == toset(["vpc-cni", "eks-pod-identity-agent"]) && !contains(keys(aws_eks_addon.this), "vpc-cni")
    error_message = "The VPC CNI and the Pod Identity agent are installed before the nodes, so aws-node never starts on the node role."
  }
}

run "without_pod_identity_the_node_role_keeps_the_cni_policy" {
  command = plan

  variables {
    enable_pod_identity = false
  }

  assert {
    condition     = contains(keys(aws_iam_role_policy_attachment.node), "AmazonEKS_CNI_Policy") && length(aws_iam_role.vpc_cni) == 0
    error_message = "With no Pod Identity (emulators) aws-node has no other credentials: the node role keeps AmazonEKS_CNI_Policy."
  }
  assert {
    condition     = length(aws_eks_addon.before_nodes["vpc-cni"].pod_identity_association) == 0
    error_message = "No association without Pod Identity."
  }
}

run "admins_get_the_cluster_submitters_only_the_jobs_namespace" {
  command = plan

  variables {
    admin_principal_arns     = ["arn:aws:iam::123456789012:role/platform-owner"]
    submitter_principal_arns = ["arn:aws:iam::123456789012:role/team-a", "arn:aws:iam::123456789012:role/team-b"]
  }

  assert {
    condition     = [for a in aws_eks_access_policy_association.admin : [a.principal_arn, a.policy_arn, one(a.access_scope).type]] == [["arn:aws:iam::123456789012:role/platform-owner", "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy", "cluster"]]
    error_message = "Only the platform's owners are cluster admins."
  }
  assert {
    condition = jsonencode(sort([for a in aws_eks_access_policy_association.submitter : "${a.principal_arn} ${a.policy_arn} ${one(a.access_scope).type} ${join(",", one(a.access_scope).namespaces)}"])) == jsonencode([
      "arn:aws:iam::123456789012:role/team-a arn:aws:eks::aws:cluster-access-policy/AmazonEKSEditPolicy namespace trainkit-jobs",
      "arn:aws:iam::123456789012:role/team-a arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy namespace trainkit-system",
      "arn:aws:iam::123456789012:role/team-b arn:aws:eks::aws:cluster-access-policy/AmazonEKSEditPolicy namespace trainkit-jobs",
      "arn:aws:iam::123456789012:role/team-b arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy namespace trainkit-system",
    ])
    error_message = "A submitter edits in trainkit-jobs and views trainkit-system, each namespace-scoped; nothing cluster-wide."
  }
  assert {
    condition     = length(aws_eks_access_entry.submitter) == 2 && alltrue([for e in aws_eks_access_entry.submitter : e.kubernetes_groups == toset(["trainkit-submitters"])])
    error_message = "Submitters carry the group the platform stack binds to PyTorchJobs and node listing."
  }
}

run "a_principal_is_an_admin_or_a_submitter_not_both" {
  command = plan

  variables {
    admin_principal_arns     = ["arn:aws:iam::123456789012:role/platform-owner"]
    submitter_principal_arns = ["arn:aws:iam::123456789012:role/platform-owner"]
  }

  expect_failures = [var.submitter_principal_arns]
}

run "the_public_endpoint_can_be_switched_off" {
  command = plan

  variables {
    endpoint_public_access = false
    public_access_cidrs    = []
  }

  assert {
    condition     = !aws_eks_cluster.this[0].vpc_config[0].endpoint_public_access && aws_eks_cluster.this[0].vpc_config[0].endpoint_private_access
    error_message = "Private endpoint only."
  }
}

run "a_public_endpoint_needs_its_cidrs" {
  command = plan

  variables {
    public_access_cidrs = []
  }

  expect_failures = [var.public_access_cidrs]
}
