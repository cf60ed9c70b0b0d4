mock_provider "aws" {
  source = "../../tests/mocks"
}

variables {
  name        = "trainkit"
  azs         = ["us-east-1a", "us-east-1b"]
  gpu_az      = "us-east-1a"
  kms_key_arn = "arn:aws:kms:us-east-1:123456789012:key/0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
}

run "only_this_accounts_flow_logs_assume_the_flow_logs_role" {
  command = plan

  # VPC User Guide, "IAM role for publishing flow logs to CloudWatch Logs"; IAM User Guide, "The confused deputy
  # problem".
  assert {
    condition     = one(one(data.aws_iam_policy_document.flow_logs_assume.statement).principals).identifiers == toset(["vpc-flow-logs.amazonaws.com"])
    error_message = "The flow logs service assumes the role."
  }
  assert {
    condition = jsonencode({ for c in one(data.aws_iam_policy_document.flow_logs_assume.statement).condition : c.variable => [c.test, c.values] }) == jsonencode({
      "aws:SourceAccount" = ["StringEquals", ["123456789012"]]
      "aws:SourceArn"     = ["ArnLike", ["arn:aws:ec2:us-east-1:123456789012:vpc-flow-log/*"]]
    })
    error_message = "Only for this account's flow logs in this region (aws:SourceAccount, aws:SourceArn), never as a confused deputy for another account."
  }
}
