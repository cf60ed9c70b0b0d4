terraform {
  required_version = ">= 1.9"

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
