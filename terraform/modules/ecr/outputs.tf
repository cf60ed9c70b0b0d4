################################################################################
# ECR
################################################################################

output "repository_urls" {
  description = "Repository URLs by short name (train, data-prep)."
  value       = { for name, repo in aws_ecr_repository.this : name => repo.repository_url }
}
