################################################################################
# ECR
################################################################################

resource "aws_ecr_repository" "this" {
  for_each = var.create ? toset(var.repositories) : toset([])

  name                 = "${var.name_prefix}/${each.value}"
  image_tag_mutability = "IMMUTABLE" # a tag always means the same image: jobs are reproducible
  force_delete         = var.force_delete

  image_scanning_configuration {
    scan_on_push = true
  }

  encryption_configuration {
    encryption_type = "KMS"
    kms_key         = var.kms_key_arn
  }

  tags = var.tags
}

resource "aws_ecr_lifecycle_policy" "this" {
  for_each = aws_ecr_repository.this

  repository = each.value.name
  policy = jsonencode({
    rules = [
      {
        # An image a submitted run uses carries the tag run-<run id> (added at submit: trainkit/backends/eks/
        # preflight.py). A rule cannot expire an image that matches the tag selection of a rule before it
        # (ECR user guide, lifecycle policy evaluation), so the rule below keeps a run's image while the run may be
        # resumed, however many newer images are pushed.
        rulePriority = 1
        description  = "Keep the images of the newest ${var.keep_run_images} submitted runs"
        selection    = { tagStatus = "tagged", tagPrefixList = ["run-"], countType = "imageCountMoreThan", countNumber = var.keep_run_images }
        action       = { type = "expire" }
      },
      {
        rulePriority = 2
        description  = "Expire untagged images after 7 days"
        selection    = { tagStatus = "untagged", countType = "sinceImagePushed", countUnit = "days", countNumber = 7 }
        action       = { type = "expire" }
      },
      {
        rulePriority = 3
        description  = "Keep the newest ${var.keep_images} images"
        selection    = { tagStatus = "any", countType = "imageCountMoreThan", countNumber = var.keep_images }
        action       = { type = "expire" }
      },
    ]
  })
}
