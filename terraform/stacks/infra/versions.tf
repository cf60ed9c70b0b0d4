terraform {
  required_version = ">= 1.9"

  # Local state; trainkit sets its path at init (.trainkit/aws/terraform.tfstate). For a team,
  # replace with an S3 backend (state locking with use_lockfile).
  backend "local" {}

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.100, < 7.0"
    }
  }
}

provider "aws" {
  region      = var.region
  max_retries = var.aws_max_retries

  default_tags {
    tags = local.tags
  }
}
