################################################################################
# ECR
################################################################################

output "repository_arns" {
  description = "Repository ARNs by short name (what a SageMaker execution role may pull from)."
  value       = { for name, repo in aws_ecr_repository.this : name => repo.arn }
}

output "repository_urls" {
  description = "Repository URLs by short name (train, data-prep)."
  value       = { for name, repo in aws_ecr_repository.this : name => repo.repository_url }
}
