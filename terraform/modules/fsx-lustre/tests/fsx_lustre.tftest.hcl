mock_provider "aws" {
  source = "../../tests/mocks"
}

variables {
  name                      = "trainkit"
  vpc_id                    = "vpc-0a1b2c3d4e5f60718"
  subnet_id                 = "subnet-0fffffffffffffff1"
  client_security_group_ids = ["sg-0c1a2b3c4d5e6f708", "sg-0d1a2b3c4d5e6f709"]
  kms_key_arn               = "arn:aws:kms:us-east-1:123456789012:key/0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
}

run "persistent_2_encrypted_in_the_gpu_subnet" {
  command = apply

  assert {
    condition     = aws_fsx_lustre_file_system.this[0].deployment_type == "PERSISTENT_2" && aws_fsx_lustre_file_system.this[0].per_unit_storage_throughput == 250
    error_message = "PERSISTENT_2 at the default 250 MB/s/TiB."
  }
  assert {
    condition     = length(aws_fsx_lustre_file_system.this[0].subnet_ids) == 1 && aws_fsx_lustre_file_system.this[0].subnet_ids[0] == var.subnet_id && aws_fsx_lustre_file_system.this[0].kms_key_id == var.kms_key_arn
    error_message = "FSx sits in the GPU subnet, encrypted with the given key."
  }
  assert {
    condition     = length(aws_fsx_lustre_file_system.this[0].root_squash_configuration) == 0
    error_message = "No root squash by default (how pods create their folders on FSx comes first)."
  }
}

run "lustre_ports_only_from_client_groups_and_itself" {
  command = apply

  assert {
    condition     = length(aws_vpc_security_group_ingress_rule.lustre) == 6
    error_message = "TCP 988 and 1018-1023 from each of the 2 client groups and from the file system's own group."
  }
  assert {
    condition     = alltrue([for r in aws_vpc_security_group_ingress_rule.lustre : r.cidr_ipv4 == null && r.cidr_ipv6 == null && r.referenced_security_group_id != null])
    error_message = "No Lustre ingress from a CIDR (least of all 0.0.0.0/0): only from security groups."
  }
  assert {
    condition     = toset([for r in aws_vpc_security_group_ingress_rule.lustre : "${r.from_port}-${r.to_port}"]) == toset(["988-988", "1018-1023"])
    error_message = "Only the Lustre ports are open."
  }
}

run "client_groups_admit_the_lustre_ports_from_the_file_servers" {
  command = apply

  assert {
    condition = toset([for r in aws_vpc_security_group_ingress_rule.client : "${r.security_group_id} ${r.from_port}-${r.to_port}"]) == toset([
      for pair in setproduct(var.client_security_group_ids, ["988-988", "1018-1023"]) : "${pair[0]} ${pair[1]}"
    ])
    error_message = "Each client group admits TCP 988 and 1018-1023 (FSx for Lustre User Guide, Lustre client VPC security group rules)."
  }
  assert {
    condition     = alltrue([for r in aws_vpc_security_group_ingress_rule.client : r.referenced_security_group_id == aws_security_group.lustre[0].id && r.ip_protocol == "tcp"])
    error_message = "Only from the file system's own group, over TCP."
  }
}

run "no_file_system_no_client_rules" {
  command = plan

  variables {
    create = false
  }

  assert {
    condition     = length(aws_vpc_security_group_ingress_rule.client) == 0
    error_message = "Without a file system the clients' groups are left as they are."
  }
}

run "s3_association_imports_and_exports" {
  command = apply

  variables {
    s3_import_path = "s3://my-datasets/imagenet"
  }

  assert {
    condition     = aws_fsx_data_repository_association.s3[0].data_repository_path == "s3://my-datasets/imagenet"
    error_message = "The data repository association links the S3 prefix."
  }
}

run "capacity_must_be_a_persistent_2_increment" {
  command = plan

  variables {
    storage_capacity_gib = 3000
  }

  expect_failures = [var.storage_capacity_gib]
}

run "s3_link_imports_and_exports_new_and_changed_files_but_no_deletions" {
  command = apply

  variables {
    s3_import_path = "s3://datasets-example/trainkit"
  }

  assert {
    condition     = toset(aws_fsx_data_repository_association.s3[0].s3[0].auto_export_policy[0].events) == toset(["NEW", "CHANGED"])
    error_message = "By default a deletion on FSx must not delete the user's S3 objects."
  }
  assert {
    condition     = toset(aws_fsx_data_repository_association.s3[0].s3[0].auto_import_policy[0].events) == toset(["NEW", "CHANGED"])
    error_message = "By default an S3 deletion does not remove files from FSx under a running job."
  }
}

run "deletions_travel_only_when_asked" {
  command = apply

  variables {
    s3_import_path = "s3://datasets-example/trainkit"
    sync_deletions = true
  }

  assert {
    condition     = contains(aws_fsx_data_repository_association.s3[0].s3[0].auto_export_policy[0].events, "DELETED") && contains(aws_fsx_data_repository_association.s3[0].s3[0].auto_import_policy[0].events, "DELETED")
    error_message = "sync_deletions = true propagates deletions both ways."
  }
}

run "root_squash_renders_when_set" {
  command = plan

  variables {
    root_squash = { no_squash_nids = ["10.0.1.6@tcp"] }
  }

  assert {
    condition     = one(aws_fsx_lustre_file_system.this[0].root_squash_configuration).root_squash == "65534:65534" && one(aws_fsx_lustre_file_system.this[0].root_squash_configuration).no_squash_nids == toset(["10.0.1.6@tcp"])
    error_message = "root_squash maps a client's root to nobody (65534:65534), except the listed NIDs."
  }
}

run "root_squash_to_root_is_refused" {
  command = plan

  variables {
    root_squash = { uid_gid = "0:0" }
  }

  expect_failures = [var.root_squash]
}
