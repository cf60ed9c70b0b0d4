mock_provider "aws" {
  source = "../../tests/mocks"
}

variables {
  name                = "trainkit"
  vpc_id              = "vpc-0a1b2c3d4e5f60718"
  subnet_ids          = ["subnet-0a1b2c3d4e5f60718", "subnet-0fffffffffffffff1"]
  public_access_cidrs = ["203.0.113.0/24"]
  kms_key_arn         = "arn:aws:kms:us-east-1:123456789012:key/0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
  tags                = { "trainkit:stack-id" = "trainkit-test", owner = "ci@example.com" }
}

run "system_nodes_volumes_and_interfaces_carry_the_stack_tags" {
  command = plan

  assert {
    condition     = toset([for spec in aws_launch_template.system[0].tag_specifications : spec.resource_type]) == toset(["instance", "volume", "network-interface"])
    error_message = "The system node group's instances, root volumes and network interfaces are tagged at launch (what the audit finds them by)."
  }
  assert {
    condition     = alltrue([for spec in aws_launch_template.system[0].tag_specifications : spec.tags["trainkit:stack-id"] == "trainkit-test" && spec.tags.Name == "trainkit-system"])
    error_message = "Each carries the stack id and the node group's Name."
  }
}
