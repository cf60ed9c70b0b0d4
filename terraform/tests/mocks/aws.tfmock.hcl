# Realistic defaults for `mock_provider "aws"`: the provider validates id formats and JSON policies
# even when mocked, so bare mocks fail (`launch_template.0.id must begin with 'lt-'`).

mock_resource "aws_vpc" {
  defaults = { id = "vpc-0a1b2c3d4e5f60718", arn = "arn:aws:ec2:us-east-1:123456789012:vpc/vpc-0a1b2c3d4e5f60718" }
}
mock_resource "aws_subnet" {
  defaults = { id = "subnet-0a1b2c3d4e5f60718", arn = "arn:aws:ec2:us-east-1:123456789012:subnet/subnet-0a1b2c3d4e5f60718" }
}
mock_resource "aws_security_group" {
  defaults = { id = "sg-0a1b2c3d4e5f60718", arn = "arn:aws:ec2:us-east-1:123456789012:security-group/sg-0a1b2c3d4e5f60718" }
}
mock_resource "aws_internet_gateway" {
  defaults = { id = "igw-0a1b2c3d4e5f60718" }
}
mock_resource "aws_eip" {
  defaults = { id = "eipalloc-0a1b2c3d4e5f60718", allocation_id = "eipalloc-0a1b2c3d4e5f60718" }
}
mock_resource "aws_nat_gateway" {
  defaults = { id = "nat-0a1b2c3d4e5f60718" }
}
mock_resource "aws_route_table" {
  defaults = { id = "rtb-0a1b2c3d4e5f60718" }
}
mock_resource "aws_vpc_endpoint" {
  defaults = { id = "vpce-0a1b2c3d4e5f60718" }
}
mock_resource "aws_kms_key" {
  defaults = {
    arn    = "arn:aws:kms:us-east-1:123456789012:key/0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
    key_id = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
  }
}
mock_resource "aws_iam_role" {
  defaults = { arn = "arn:aws:iam::123456789012:role/trainkit-mock", name = "trainkit-mock" }
}
mock_resource "aws_cloudwatch_log_group" {
  defaults = { arn = "arn:aws:logs:us-east-1:123456789012:log-group:/trainkit/mock" }
}
mock_resource "aws_launch_template" {
  defaults = { id = "lt-0a1b2c3d4e5f60718", latest_version = 1 }
}
mock_resource "aws_eks_cluster" {
  defaults = {
    arn                   = "arn:aws:eks:us-east-1:123456789012:cluster/trainkit"
    endpoint              = "https://0A1B2C3D4E5F60718.gr7.us-east-1.eks.amazonaws.com"
    certificate_authority = [{ data = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==" }]
    vpc_config = {
      cluster_security_group_id = "sg-0c1a2b3c4d5e6f708"
      vpc_id                    = "vpc-0a1b2c3d4e5f60718"
    }
  }
}
mock_resource "aws_fsx_lustre_file_system" {
  defaults = {
    id         = "fs-0a1b2c3d4e5f60718"
    arn        = "arn:aws:fsx:us-east-1:123456789012:file-system/fs-0a1b2c3d4e5f60718"
    dns_name   = "fs-0a1b2c3d4e5f60718.fsx.us-east-1.amazonaws.com"
    mount_name = "abcdefgh"
  }
}
mock_resource "aws_ecr_repository" {
  defaults = {
    repository_url = "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainkit/train"
    arn            = "arn:aws:ecr:us-east-1:123456789012:repository/trainkit/train"
  }
}
mock_resource "aws_s3_bucket" {
  defaults = { arn = "arn:aws:s3:::trainkit-runs-123456789012" }
}
mock_resource "aws_secretsmanager_secret" {
  defaults = { arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:trainkit-hf-token-AbCdEf" }
}
mock_resource "aws_iam_instance_profile" {
  defaults = { arn = "arn:aws:iam::123456789012:instance-profile/trainkit-mock" }
}
mock_resource "aws_batch_compute_environment" {
  defaults = { arn = "arn:aws:batch:us-east-1:123456789012:compute-environment/terraform-mock" }
}
mock_resource "aws_batch_job_queue" {
  defaults = { arn = "arn:aws:batch:us-east-1:123456789012:job-queue/trainkit-batch" }
}
mock_resource "aws_placement_group" {
  defaults = { id = "trainkit-gpu", placement_group_id = "pg-0a1b2c3d4e5f60718" }
}

mock_data "aws_iam_policy_document" {
  defaults = { json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}" }
}
mock_data "aws_caller_identity" {
  defaults = { account_id = "123456789012", arn = "arn:aws:iam::123456789012:user/ci" }
}
mock_data "aws_partition" {
  defaults = { partition = "aws" }
}
mock_data "aws_region" {
  defaults = { name = "us-east-1" }
}
mock_data "aws_availability_zones" {
  defaults = { names = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"] }
}
