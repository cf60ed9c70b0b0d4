"""Terraform driver for the AWS profile: CLI config (offline provider mirror), plan, apply, destroy."""
