################################################################################
# What the launcher refers to (trainkit/backends/eks/cluster.py holds the same names)
################################################################################

output "jobs_namespace" {
  description = "Namespace of training jobs."
  value       = var.jobs_namespace
}

output "etcd_endpoint" {
  description = "host:port of the rendezvous etcd inside the cluster."
  value       = "trainkit-etcd.${var.system_namespace}.svc:2379"
}

output "fsx_claim" {
  description = "ReadWriteMany claim on the FSx file system in the jobs namespace."
  value       = local.fsx_claims.jobs.claim
}

output "gpu_quota" {
  description = "GPUs the jobs namespace may request at once."
  value       = local.gpu_quota
}
