terraform {
  required_version = ">= 1.9"

  # Local state beside the infra stack's (.trainkit/aws/platform/terraform.tfstate), set at init.
  backend "local" {}

  required_providers {
    helm = {
      source  = "hashicorp/helm"
      version = ">= 3.0.2, < 4.0"
    }
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = ">= 2.38.0, < 3.0"
    }
    kustomization = {
      source  = "kbst/kustomization"
      version = ">= 0.9.6, < 1.0"
    }
  }
}

################################################################################
# Providers: the cluster from the infra stack's outputs
################################################################################

# Credentials come from `aws eks get-token` at run time, so no token is ever written to this state
# (a token read through the EKS cluster-auth data source would be).
locals {
  cluster_exec = {
    api_version = "client.authentication.k8s.io/v1beta1"
    command     = "aws"
    args        = ["eks", "get-token", "--cluster-name", local.infra.cluster_name, "--region", local.infra.region, "--output", "json"]
  }
}

provider "kubernetes" {
  host                   = local.infra.cluster_endpoint
  cluster_ca_certificate = base64decode(local.infra.cluster_certificate_authority_data)

  exec {
    api_version = local.cluster_exec.api_version
    command     = local.cluster_exec.command
    args        = local.cluster_exec.args
  }
}

provider "helm" {
  kubernetes = {
    host                   = local.infra.cluster_endpoint
    cluster_ca_certificate = base64decode(local.infra.cluster_certificate_authority_data)
    exec                   = local.cluster_exec
  }
}

provider "kustomization" {
  kubeconfig_raw = yamlencode({
    apiVersion      = "v1"
    kind            = "Config"
    current-context = "trainkit"
    clusters        = [{ name = "trainkit", cluster = { server = local.infra.cluster_endpoint, certificate-authority-data = local.infra.cluster_certificate_authority_data } }]
    users           = [{ name = "trainkit", user = { exec = { apiVersion = local.cluster_exec.api_version, command = local.cluster_exec.command, args = local.cluster_exec.args } } }]
    contexts        = [{ name = "trainkit", context = { cluster = "trainkit", user = "trainkit" } }]
  })
}
