################################################################################
# Infra outputs
################################################################################

data "terraform_remote_state" "infra" {
  backend = "local"
  config = {
    path = var.infra_state_path
  }
}

locals {
  infra     = data.terraform_remote_state.infra.outputs
  gpu_quota = coalesce(var.gpu_quota, local.infra.gpu_nodes_max * local.infra.gpus_per_node)
  labels = {
    "app.kubernetes.io/managed-by" = "terraform"
    "app.kubernetes.io/part-of"    = "trainkit"
  }
  fsx_size = "${local.infra.fsx_storage_capacity_gib}Gi"

  # Every chart pinned to one version (tests/unit/test_platform_stack.py refuses ranges), the newest
  # patch of its line as of 2026-11: nvidia-device-plugin v0.20.0 (tag of NVIDIA/k8s-device-plugin,
  # 2026-08-19, newest tag), aws-efa-k8s-device-plugin v0.5.30 (aws/eks-charts master Chart.yaml and the
  # gh-pages index, 2026-07-21).
  charts = {
    nvidia-device-plugin = {
      repository = "https://nvidia.github.io/k8s-device-plugin"
      version    = "0.20.0"
    }
    aws-efa-k8s-device-plugin = {
      repository = "https://aws.github.io/eks-charts"
      version    = "v0.5.30"
    }
  }

  # The jobs' claim on the FSx file system: runs, data and checkpoints; and the platform's, for the one step that
  # gives the file system's root to the jobs' user (below). etcd keeps its data on a volume of its own, out of reach
  # of every job's mount.
  fsx_claims = {
    jobs = {
      namespace = var.jobs_namespace
      claim     = "fsx-shared"
    }
    layout = {
      namespace = var.system_namespace
      claim     = "fsx-layout"
    }
  }
  # The user every job's container runs as (trainkit/backends/eks/cluster.py JOB_UID); the FSx root is theirs, given
  # by the layout Job (cluster.py FSX_LAYOUT), which the launcher's preflight reads.
  job_uid    = 1000
  fsx_layout = "trainkit-fsx-layout"
}

################################################################################
# Namespaces and quota
################################################################################

resource "kubernetes_manifest" "namespace" {
  for_each = toset([var.jobs_namespace, var.system_namespace, var.monitoring_namespace])

  manifest = {
    apiVersion = "v1"
    kind       = "Namespace"
    metadata = {
      name   = each.value
      labels = local.labels
    }
  }
}

resource "kubernetes_manifest" "gpu_quota" {
  manifest = {
    apiVersion = "v1"
    kind       = "ResourceQuota"
    metadata = {
      name      = "gpus"
      namespace = var.jobs_namespace
      labels    = local.labels
    }
    spec = {
      hard = {
        "requests.nvidia.com/gpu" = tostring(local.gpu_quota)
      }
    }
  }

  depends_on = [kubernetes_manifest.namespace]
}

# The data-preparation job's identity (invoke data.imagenet --target eks). EKS Pod Identity gives its pods the
# infra stack's data-reader role (read-only, on data_source_buckets) through the agent add-on's own projected
# token, so the account mounts no Kubernetes API token.
resource "kubernetes_manifest" "data_service_account" {
  manifest = {
    apiVersion = "v1"
    kind       = "ServiceAccount"
    metadata = {
      name      = var.data_service_account
      namespace = var.jobs_namespace
      labels    = local.labels
    }
    automountServiceAccountToken = false
  }

  depends_on = [kubernetes_manifest.namespace]
}

# The identity of a training job that logs to the infra stack's SageMaker managed MLflow tracking server: EKS Pod
# Identity gives its pods the infra stack's training role (mlflow_enabled), whose credentials sign the requests;
# like the data job's, the account mounts no Kubernetes API token.
resource "kubernetes_manifest" "training_service_account" {
  manifest = {
    apiVersion = "v1"
    kind       = "ServiceAccount"
    metadata = {
      name      = var.training_service_account
      namespace = var.jobs_namespace
      labels    = local.labels
    }
    automountServiceAccountToken = false
  }

  depends_on = [kubernetes_manifest.namespace]
}

################################################################################
# FSx for Lustre volume (static provisioning through the FSx CSI driver add-on)
################################################################################

resource "kubernetes_manifest" "fsx_volume" {
  for_each = local.fsx_claims

  manifest = {
    apiVersion = "v1"
    kind       = "PersistentVolume"
    metadata = {
      name   = "${each.value.namespace}-${each.value.claim}"
      labels = local.labels
    }
    spec = {
      capacity                      = { storage = local.fsx_size }
      accessModes                   = ["ReadWriteMany"]
      persistentVolumeReclaimPolicy = "Retain"
      storageClassName              = ""
      mountOptions                  = ["flock"]
      claimRef = {
        namespace = each.value.namespace
        name      = each.value.claim
      }
      csi = {
        driver       = "fsx.csi.aws.com"
        volumeHandle = local.infra.fsx_file_system_id
        volumeAttributes = {
          dnsname   = local.infra.fsx_dns_name
          mountname = local.infra.fsx_mount_name
        }
      }
    }
  }
}

resource "kubernetes_manifest" "fsx_claim" {
  for_each = local.fsx_claims

  manifest = {
    apiVersion = "v1"
    kind       = "PersistentVolumeClaim"
    metadata = {
      name      = each.value.claim
      namespace = each.value.namespace
      labels    = local.labels
    }
    spec = {
      accessModes      = ["ReadWriteMany"]
      storageClassName = ""
      volumeName       = "${each.value.namespace}-${each.value.claim}"
      resources        = { requests = { storage = local.fsx_size } }
    }
  }

  depends_on = [kubernetes_manifest.namespace, kubernetes_manifest.fsx_volume]
}

# The FSx root belongs to the jobs' user (trainkit/backends/eks/fsx.py): FSx squashes root on every client but the
# system nodes (the infra stack's fsx_root_squash), so this one step runs there, as root with only the capabilities
# it uses, in the platform's namespace, which the jobs' admission rule does not cover. Once per file system: a
# finished Job stays (no TTL), and a later apply leaves it as it is. It runs in the platform's own image (as the
# issuer below); without that image the root stays root's and jobs cannot write (preflight says so).
resource "kubernetes_manifest" "fsx_layout" {
  for_each = local.etcd_issuer

  manifest = {
    apiVersion = "batch/v1"
    kind       = "Job"
    metadata   = { name = local.fsx_layout, namespace = var.system_namespace, labels = local.labels }
    spec = {
      backoffLimit = 3
      template = {
        metadata = { labels = merge(local.labels, { "app.kubernetes.io/name" = local.fsx_layout }) }
        spec = {
          restartPolicy                = "Never"
          automountServiceAccountToken = false # it does not talk to the Kubernetes API
          nodeSelector                 = { "trainkit/pool" = "system" }
          securityContext              = { seccompProfile = { type = "RuntimeDefault" } }
          containers = [{
            name    = "layout"
            image   = each.value
            command = ["python", "-m", "trainkit.backends.eks.fsx", "layout", "/fsx", "--owner=${local.job_uid}:${local.job_uid}"]
            resources = {
              requests = { cpu = "100m", memory = "128Mi" }
              limits   = { cpu = "1", memory = "256Mi" }
            }
            # chown(2) needs CHOWN, chmod(2) of another's file FOWNER, and writing its mark in a folder the jobs'
            # user owns DAC_OVERRIDE (capabilities(7)); nothing else.
            securityContext = {
              runAsUser                = 0
              runAsNonRoot             = false
              allowPrivilegeEscalation = false
              readOnlyRootFilesystem   = true
              capabilities             = { drop = ["ALL"], add = ["CHOWN", "FOWNER", "DAC_OVERRIDE"] }
            }
            volumeMounts = [{ name = "fsx", mountPath = "/fsx" }]
          }]
          volumes = [{ name = "fsx", persistentVolumeClaim = { claimName = local.fsx_claims.layout.claim } }]
        }
      }
    }
  }

  wait {
    condition {
      type   = "Complete"
      status = "True"
    }
  }

  timeouts {
    create = "20m"
  }

  # A Job's pod template cannot change once created (Kubernetes' batch validation, ValidateJobSpecUpdate), and the
  # platform's image tag changes with every build: a later apply leaves the finished Job as it is.
  lifecycle {
    ignore_changes = [manifest]
  }

  depends_on = [kubernetes_manifest.fsx_claim]
}

################################################################################
# etcd for the etcd rendezvous (--rdzv etcd, the EKS default)
################################################################################

locals {
  # etcd's uid and gid; its volume is this group's.
  etcd_user = 1000
  # etcd serves HTTPS only and asks every client for a certificate from the platform's CA; the issuer (below) makes
  # the CA, etcd's certificate (this Secret, which etcd mounts: the pod waits until the issuer's first pass) and
  # each job's identity (trainkit/backends/eks/etcd_issuer.py). /health and /metrics stay plain HTTP on a port of
  # their own for the kubelet's probes, which present no certificate.
  etcd_storage_class = "trainkit-etcd"
  etcd_tls_dir       = "/etc/etcd/tls"
  etcd_server_tls    = "trainkit-etcd-server"
  etcd_metrics_port  = 2381
  etcd_issuer_name   = "trainkit-etcd-issuer"
  etcd_issuer        = var.idle_guard_image != null ? { issuer = var.idle_guard_image } : {}
  # the namespaces of its two Roles (its own Secrets; the jobs and their identities)
  etcd_issuer_namespaces = var.idle_guard_image != null ? { system = var.system_namespace, jobs = var.jobs_namespace } : {}
}

resource "kubernetes_manifest" "etcd_service" {
  manifest = {
    apiVersion = "v1"
    kind       = "Service"
    metadata = {
      name      = "trainkit-etcd"
      namespace = var.system_namespace
      labels    = local.labels
    }
    spec = {
      selector = { "app.kubernetes.io/name" = "trainkit-etcd" }
      ports    = [{ name = "client", port = 2379, targetPort = 2379, protocol = "TCP" }]
    }
  }

  depends_on = [kubernetes_manifest.namespace]
}

resource "kubernetes_manifest" "etcd" {
  manifest = {
    apiVersion = "apps/v1"
    kind       = "StatefulSet"
    metadata = {
      name      = "trainkit-etcd"
      namespace = var.system_namespace
      labels    = local.labels
    }
    spec = {
      serviceName = "trainkit-etcd"
      replicas    = 1
      selector    = { matchLabels = { "app.kubernetes.io/name" = "trainkit-etcd" } }
      template = {
        metadata = { labels = merge(local.labels, { "app.kubernetes.io/name" = "trainkit-etcd" }) }
        spec = {
          automountServiceAccountToken = false # etcd does not talk to the Kubernetes API
          # The volume is etcd's alone: the EBS CSI driver declares fsGroupPolicy File (aws-ebs-csi-driver's chart,
          # templates/csidriver.yaml), so the kubelet gives its root to fsGroup (group rwx, setgid) before etcd
          # starts, and etcd, non-root with no capability, makes its data directory inside, 0700. OnRootMismatch: the
          # kubelet changes nothing once the root is the group's, so a restart leaves that directory 0700 (Always
          # would add the group's rights to everything inside at every start).
          securityContext = {
            runAsNonRoot        = true
            runAsUser           = local.etcd_user
            runAsGroup          = local.etcd_user
            fsGroup             = local.etcd_user
            fsGroupChangePolicy = "OnRootMismatch"
            seccompProfile      = { type = "RuntimeDefault" }
          }
          containers = [{
            name  = "etcd"
            image = var.etcd_image
            command = [
              "etcd",
              "--name=trainkit-etcd",
              "--data-dir=/var/lib/etcd/data",
              "--enable-v2=true",
              "--listen-client-urls=https://0.0.0.0:2379",
              "--advertise-client-urls=https://trainkit-etcd.${var.system_namespace}.svc:2379",
              "--cert-file=${local.etcd_tls_dir}/tls.crt",
              "--key-file=${local.etcd_tls_dir}/tls.key",
              "--client-cert-auth=true",
              "--trusted-ca-file=${local.etcd_tls_dir}/ca.crt",
              "--listen-metrics-urls=http://0.0.0.0:${local.etcd_metrics_port}",
              "--listen-peer-urls=http://127.0.0.1:2380",
              "--initial-advertise-peer-urls=http://127.0.0.1:2380",
              "--initial-cluster=trainkit-etcd=http://127.0.0.1:2380",
            ]
            ports = [
              { name = "client", containerPort = 2379, protocol = "TCP" },
              { name = "metrics", containerPort = local.etcd_metrics_port, protocol = "TCP" },
            ]
            readinessProbe = {
              httpGet             = { path = "/health", port = local.etcd_metrics_port }
              periodSeconds       = 5
              initialDelaySeconds = 2
            }
            livenessProbe = {
              httpGet          = { path = "/health", port = local.etcd_metrics_port }
              periodSeconds    = 10
              failureThreshold = 6
            }
            resources = {
              requests = { cpu = "250m", memory = "256Mi" }
              limits   = { cpu = "1", memory = "1Gi" }
            }
            securityContext = {
              allowPrivilegeEscalation = false
              readOnlyRootFilesystem   = true
              capabilities             = { drop = ["ALL"] }
            }
            volumeMounts = [
              { name = "data", mountPath = "/var/lib/etcd" },
              { name = "tls", mountPath = local.etcd_tls_dir, readOnly = true },
            ]
          }]
          # 0440 with fsGroup = etcd's group: etcd reads its key, nobody else in the pod does
          volumes = [{ name = "tls", secret = { secretName = local.etcd_server_tls, defaultMode = 288 } }]
        }
      }
      # etcd's data on an EBS volume of its own (a restarted etcd finds the rendezvous state it had); deleting the
      # StatefulSet (make down) deletes its claim, and the volume with it (the class's reclaimPolicy).
      volumeClaimTemplates = [{
        metadata = { name = "data", labels = local.labels }
        spec = {
          accessModes      = ["ReadWriteOnce"]
          storageClassName = local.etcd_storage_class
          resources        = { requests = { storage = "1Gi" } }
        }
      }]
      persistentVolumeClaimRetentionPolicy = { whenDeleted = "Delete", whenScaled = "Retain" }
    }
  }

  depends_on = [kubernetes_manifest.etcd_storage_class]
}

# gp3, encrypted with the stack's key, tagged with the stack's id (so `make down`'s audit finds a volume left
# behind) and made in the zone of the node etcd is scheduled on (WaitForFirstConsumer). Parameters: the driver's
# CreateVolume parameters (kubernetes-sigs/aws-ebs-csi-driver, its parameters page) and the Kubernetes documentation's
# StorageClass example for it (kubernetes/website, release-1.32, the storageclass-aws-ebs example).
resource "kubernetes_manifest" "etcd_storage_class" {
  manifest = {
    apiVersion  = "storage.k8s.io/v1"
    kind        = "StorageClass"
    metadata    = { name = local.etcd_storage_class, labels = local.labels }
    provisioner = "ebs.csi.aws.com"
    parameters = {
      type                        = "gp3"
      encrypted                   = "true"
      kmsKeyId                    = local.infra.kms_key_arn
      "csi.storage.k8s.io/fstype" = "ext4"
      tagSpecification_1          = "trainkit:stack-id=${local.infra.stack_id}"
      tagSpecification_2          = "trainkit:volume=etcd"
    }
    reclaimPolicy        = "Delete"
    volumeBindingMode    = "WaitForFirstConsumer"
    allowVolumeExpansion = true
  }
}

# No pod of the jobs' namespace accepts a connection unless a policy admits it: each submission creates a policy that
# lets its own pods reach each other and Prometheus reach their metrics ports (trainkit/backends/eks/submission.py),
# so one job's pods never reach another's (its c10d store, its workers' TCP store, NCCL's sockets). Policies add
# up, and a pod selected by none with Ingress is not isolated (Kubernetes' NetworkPolicy concept page, "Default
# deny all ingress traffic"); the VPC CNI's policy agent enforces them (terraform/modules/eks turns it on).
resource "kubernetes_manifest" "jobs_deny_ingress" {
  manifest = {
    apiVersion = "networking.k8s.io/v1"
    kind       = "NetworkPolicy"
    metadata = {
      name      = "trainkit-deny-ingress"
      namespace = var.jobs_namespace
      labels    = local.labels
    }
    spec = {
      podSelector = {}
      policyTypes = ["Ingress"]
    }
  }

  depends_on = [kubernetes_manifest.namespace]
}

# What no pod of the jobs' namespace may do, whoever creates it (a submitter, a user's script through the API): use
# the node's network, process or IPC namespace, mount a host path, run privileged, bind a host port, or add a
# capability beyond Pod Security's "baseline" list and IPC_LOCK. Baseline itself would refuse the IPC_LOCK that EFA
# needs to pin memory (Pod Security Standards, "Capabilities": only the listed ones may be added), so the rule is
# written here (ValidatingAdmissionPolicy, admissionregistration.k8s.io/v1, GA in Kubernetes 1.30). A hostNetwork
# pod on a GPU node would reach the instance metadata and the node's role, and another pod's traffic.
locals {
  pod_capabilities = ["AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT", "IPC_LOCK"]
  pod_rules_name   = "trainkit-jobs-pods"
  # Pod Security Standards, baseline: "SELinux" (the allowed types, or none) and "Sysctls" (the safe set).
  pod_selinux_types = ["", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"]
  pod_safe_sysctls  = ["kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"]
}

resource "kubernetes_manifest" "jobs_pod_rules" {
  manifest = {
    apiVersion = "admissionregistration.k8s.io/v1"
    kind       = "ValidatingAdmissionPolicy"
    metadata   = { name = local.pod_rules_name, labels = local.labels }
    spec = {
      failurePolicy = "Fail"
      matchConstraints = {
        resourceRules = [{
          apiGroups   = [""]
          apiVersions = ["v1"]
          operations  = ["CREATE", "UPDATE"]
          resources   = ["pods", "pods/ephemeralcontainers"]
        }]
      }
      variables = [{
        name       = "containers"
        expression = "object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : []) + (has(object.spec.ephemeralContainers) ? object.spec.ephemeralContainers : [])"
      }]
      validations = [
        {
          expression = "!(has(object.spec.hostNetwork) && object.spec.hostNetwork) && !(has(object.spec.hostPID) && object.spec.hostPID) && !(has(object.spec.hostIPC) && object.spec.hostIPC)"
          message    = "pods in the jobs' namespace may not share the node's network, process or IPC namespace (hostNetwork, hostPID, hostIPC)"
        },
        {
          expression = "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath))"
          message    = "pods in the jobs' namespace may not mount a path of the node (hostPath volumes); use the FSx claim"
        },
        {
          expression = "variables.containers.all(c, !has(c.securityContext) || !has(c.securityContext.privileged) || !c.securityContext.privileged)"
          message    = "containers in the jobs' namespace may not run privileged"
        },
        {
          expression = "variables.containers.all(c, !has(c.ports) || c.ports.all(p, !has(p.hostPort) || p.hostPort == 0))"
          message    = "containers in the jobs' namespace may not bind a port of the node (hostPort)"
        },
        {
          expression = "variables.containers.all(c, !has(c.securityContext) || !has(c.securityContext.capabilities) || !has(c.securityContext.capabilities.add) || c.securityContext.capabilities.add.all(a, a in ${jsonencode(local.pod_capabilities)}))"
          message    = "containers in the jobs' namespace may add only IPC_LOCK and Pod Security baseline's capabilities"
        },
        {
          expression = "variables.containers.all(c, !has(c.securityContext) || ((!has(c.securityContext.procMount) || c.securityContext.procMount == 'Default') && (!has(c.securityContext.seccompProfile) || c.securityContext.seccompProfile.type != 'Unconfined') && (!has(c.securityContext.appArmorProfile) || c.securityContext.appArmorProfile.type != 'Unconfined') && (!has(c.securityContext.seLinuxOptions) || !has(c.securityContext.seLinuxOptions.type) || c.securityContext.seLinuxOptions.type in ${jsonencode(local.pod_selinux_types)})))"
          message    = "containers in the jobs' namespace may not unmask /proc (procMount), run without seccomp or AppArmor (Unconfined), or take an SELinux type beyond Pod Security baseline's"
        },
        {
          expression = "!has(object.spec.securityContext) || ((!has(object.spec.securityContext.seccompProfile) || object.spec.securityContext.seccompProfile.type != 'Unconfined') && (!has(object.spec.securityContext.appArmorProfile) || object.spec.securityContext.appArmorProfile.type != 'Unconfined') && (!has(object.spec.securityContext.seLinuxOptions) || !has(object.spec.securityContext.seLinuxOptions.type) || object.spec.securityContext.seLinuxOptions.type in ${jsonencode(local.pod_selinux_types)}) && (!has(object.spec.securityContext.sysctls) || object.spec.securityContext.sysctls.all(s, s.name in ${jsonencode(local.pod_safe_sysctls)})))"
          message    = "pods in the jobs' namespace may not run without seccomp or AppArmor (Unconfined), take an SELinux type beyond Pod Security baseline's, or set a sysctl beyond its safe list"
        },
        # Pod Security "restricted", "Running as Non-root" and "Running as Non-root user" (pod-security-admission's
        # check_runAsNonRoot.go, check_runAsUser.go): runAsNonRoot true on the pod or on every container, never false
        # on one; runAsUser never 0. FSx squashes root anyway; this keeps root out of the pods that mount it.
        {
          expression = "(has(object.spec.securityContext) && has(object.spec.securityContext.runAsNonRoot) && object.spec.securityContext.runAsNonRoot ? variables.containers.all(c, !has(c.securityContext) || !has(c.securityContext.runAsNonRoot) || c.securityContext.runAsNonRoot) : variables.containers.all(c, has(c.securityContext) && has(c.securityContext.runAsNonRoot) && c.securityContext.runAsNonRoot)) && !(has(object.spec.securityContext) && has(object.spec.securityContext.runAsUser) && object.spec.securityContext.runAsUser == 0) && variables.containers.all(c, !has(c.securityContext) || !has(c.securityContext.runAsUser) || c.securityContext.runAsUser != 0)"
          message    = "pods in the jobs' namespace must run as a non-root user: set securityContext.runAsNonRoot true and a non-zero runAsUser (trainkit's pods run as ${local.job_uid})"
        },
      ]
    }
  }
}

resource "kubernetes_manifest" "jobs_pod_rules_binding" {
  manifest = {
    apiVersion = "admissionregistration.k8s.io/v1"
    kind       = "ValidatingAdmissionPolicyBinding"
    metadata   = { name = local.pod_rules_name, labels = local.labels }
    spec = {
      policyName        = local.pod_rules_name
      validationActions = ["Deny"]
      matchResources = {
        namespaceSelector = { matchLabels = { "kubernetes.io/metadata.name" = var.jobs_namespace } }
      }
    }
  }

  depends_on = [kubernetes_manifest.jobs_pod_rules]
}

# Submitters' access entries (the infra stack's submitter_principal_arns) carry AmazonEKSEditPolicy in the jobs'
# namespace and AmazonEKSViewPolicy in this one, which have neither PyTorchJobs nor nodes (EKS User Guide, "Access
# policy permissions"); their Kubernetes group gets what `invoke train --target eks` uses beyond them: PyTorchJobs in
# the jobs' namespace (create, follow, stop) and the list of nodes (its capacity check). Nothing cluster-wide else.
locals {
  submitters = try(local.infra.submitters.kubernetes_group, null) == null ? {} : {
    group = local.infra.submitters.kubernetes_group
  }
  submitter_name = "trainkit-submitter"
}

resource "kubernetes_manifest" "submitter_jobs_role" {
  for_each = local.submitters

  manifest = {
    apiVersion = "rbac.authorization.k8s.io/v1"
    kind       = "Role"
    metadata   = { name = local.submitter_name, namespace = var.jobs_namespace, labels = local.labels }
    rules = [
      { apiGroups = ["kubeflow.org"], resources = ["pytorchjobs"], verbs = ["create", "get", "list", "watch", "delete"] },
    ]
  }

  depends_on = [kubernetes_manifest.namespace]
}

resource "kubernetes_manifest" "submitter_jobs_binding" {
  for_each = local.submitters

  manifest = {
    apiVersion = "rbac.authorization.k8s.io/v1"
    kind       = "RoleBinding"
    metadata   = { name = local.submitter_name, namespace = var.jobs_namespace, labels = local.labels }
    roleRef    = { apiGroup = "rbac.authorization.k8s.io", kind = "Role", name = local.submitter_name }
    subjects   = [{ apiGroup = "rbac.authorization.k8s.io", kind = "Group", name = each.value }]
  }

  depends_on = [kubernetes_manifest.submitter_jobs_role]
}

resource "kubernetes_manifest" "submitter_nodes_role" {
  for_each = local.submitters

  manifest = {
    apiVersion = "rbac.authorization.k8s.io/v1"
    kind       = "ClusterRole"
    metadata   = { name = local.submitter_name, labels = local.labels }
    rules      = [{ apiGroups = [""], resources = ["nodes"], verbs = ["get", "list"] }]
  }
}

resource "kubernetes_manifest" "submitter_nodes_binding" {
  for_each = local.submitters

  manifest = {
    apiVersion = "rbac.authorization.k8s.io/v1"
    kind       = "ClusterRoleBinding"
    metadata   = { name = local.submitter_name, labels = local.labels }
    roleRef    = { apiGroup = "rbac.authorization.k8s.io", kind = "ClusterRole", name = local.submitter_name }
    subjects   = [{ apiGroup = "rbac.authorization.k8s.io", kind = "Group", name = each.value }]
  }

  depends_on = [kubernetes_manifest.submitter_nodes_role]
}

# Only the training pods and the issuer reach etcd: the jobs' namespace and the issuer's pod, on the client port (the
# VPC CNI's policy agent enforces it; terraform/modules/eks turns it on). Which keys each job reaches is etcd's own
# rule: its certificate's user and role (trainkit/backends/eks/etcd_tls.py).
resource "kubernetes_manifest" "etcd_ingress" {
  manifest = {
    apiVersion = "networking.k8s.io/v1"
    kind       = "NetworkPolicy"
    metadata = {
      name      = "trainkit-etcd-from-jobs"
      namespace = var.system_namespace
      labels    = local.labels
    }
    spec = {
      podSelector = { matchLabels = { "app.kubernetes.io/name" = "trainkit-etcd" } }
      policyTypes = ["Ingress"]
      ingress = [{
        from = [
          { namespaceSelector = { matchLabels = { "kubernetes.io/metadata.name" = var.jobs_namespace } } },
          { podSelector = { matchLabels = { "app.kubernetes.io/name" = local.etcd_issuer_name } } },
        ]
        ports = [{ protocol = "TCP", port = 2379 }]
      }]
    }
  }

  depends_on = [kubernetes_manifest.namespace]
}

################################################################################
# etcd issuer: the CA, etcd's certificate, each job's etcd identity
#
# trainkit/backends/eks/etcd_issuer.py, in the platform's own image (containers/train/Dockerfile's stage guard,
# which `make up PROFILE=aws` builds and pushes between the stacks). Without that image there is no issuer, and the
# launcher refuses --rdzv etcd with the reason (trainkit/backends/eks/preflight.py).
################################################################################

resource "kubernetes_manifest" "etcd_issuer_service_account" {
  for_each = local.etcd_issuer

  manifest = {
    apiVersion = "v1"
    kind       = "ServiceAccount"
    metadata   = { name = local.etcd_issuer_name, namespace = var.system_namespace, labels = local.labels }
  }

  depends_on = [kubernetes_manifest.namespace]
}

# Its two Secrets here: the CA (created on the first pass, then only read) and etcd's certificate. RBAC cannot limit
# `create` by name (the name is not known when it is authorized), so create is open in this namespace.
resource "kubernetes_manifest" "etcd_issuer_system_role" {
  for_each = local.etcd_issuer

  manifest = {
    apiVersion = "rbac.authorization.k8s.io/v1"
    kind       = "Role"
    metadata   = { name = local.etcd_issuer_name, namespace = var.system_namespace, labels = local.labels }
    rules = [
      { apiGroups = [""], resources = ["secrets"], verbs = ["create"] },
      {
        apiGroups     = [""]
        resources     = ["secrets"]
        resourceNames = ["trainkit-etcd-ca", local.etcd_server_tls]
        verbs         = ["get", "update"]
      },
    ]
  }

  depends_on = [kubernetes_manifest.namespace]
}

# In the jobs' namespace: the jobs (listed), each job's identity Secret (read, created, deleted: its name is the
# job's) and its status ConfigMap, which the launcher reads before it submits an etcd job.
resource "kubernetes_manifest" "etcd_issuer_jobs_role" {
  for_each = local.etcd_issuer

  manifest = {
    apiVersion = "rbac.authorization.k8s.io/v1"
    kind       = "Role"
    metadata   = { name = local.etcd_issuer_name, namespace = var.jobs_namespace, labels = local.labels }
    rules = [
      { apiGroups = ["kubeflow.org"], resources = ["pytorchjobs"], verbs = ["list"] },
      { apiGroups = [""], resources = ["secrets"], verbs = ["get", "create", "delete"] },
      { apiGroups = [""], resources = ["configmaps"], verbs = ["create"] },
      { apiGroups = [""], resources = ["configmaps"], resourceNames = [local.etcd_issuer_name], verbs = ["get", "update"] },
    ]
  }

  depends_on = [kubernetes_manifest.namespace]
}

# Each Role above bound to the issuer's service account, in its namespace.
resource "kubernetes_manifest" "etcd_issuer_binding" {
  for_each = local.etcd_issuer_namespaces

  manifest = {
    apiVersion = "rbac.authorization.k8s.io/v1"
    kind       = "RoleBinding"
    metadata   = { name = local.etcd_issuer_name, namespace = each.value, labels = local.labels }
    roleRef    = { apiGroup = "rbac.authorization.k8s.io", kind = "Role", name = local.etcd_issuer_name }
    subjects   = [{ kind = "ServiceAccount", name = local.etcd_issuer_name, namespace = var.system_namespace }]
  }

  depends_on = [kubernetes_manifest.etcd_issuer_system_role, kubernetes_manifest.etcd_issuer_jobs_role]
}

resource "kubernetes_manifest" "etcd_issuer" {
  for_each = local.etcd_issuer

  manifest = {
    apiVersion = "apps/v1"
    kind       = "Deployment"
    metadata   = { name = local.etcd_issuer_name, namespace = var.system_namespace, labels = local.labels }
    spec = {
      replicas = 1
      strategy = { type = "Recreate" } # one issuer at a time
      selector = { matchLabels = { "app.kubernetes.io/name" = local.etcd_issuer_name } }
      template = {
        metadata = { labels = merge(local.labels, { "app.kubernetes.io/name" = local.etcd_issuer_name }) }
        spec = {
          serviceAccountName = local.etcd_issuer_name
          securityContext = {
            runAsNonRoot   = true
            runAsUser      = 1000
            seccompProfile = { type = "RuntimeDefault" }
          }
          containers = [{
            name    = "issuer"
            image   = each.value
            command = ["python", "-m", "trainkit.backends.eks.etcd_issuer"]
            args    = ["--etcd=https://trainkit-etcd.${var.system_namespace}.svc:2379"]
            resources = {
              requests = { cpu = "50m", memory = "128Mi" }
              limits   = { cpu = "500m", memory = "256Mi" }
            }
            securityContext = {
              allowPrivilegeEscalation = false
              readOnlyRootFilesystem   = true
              capabilities             = { drop = ["ALL"] }
            }
            # root's certificate passes through a private temporary folder while the TLS context loads it
            volumeMounts = [{ name = "tmp", mountPath = "/tmp" }]
          }]
          volumes = [{ name = "tmp", emptyDir = { medium = "Memory", sizeLimit = "1Mi" } }]
        }
      }
    }
  }

  depends_on = [kubernetes_manifest.etcd_issuer_binding]
}

################################################################################
# Device plugins
################################################################################

# Neither device-plugin chart renders an object of a CRD kind with these values (k8s-device-plugin
# v0.20.0: only its optional NFD subchart, off here, brings CRDs and a PodMonitor; aws-efa-k8s-device-plugin
# v0.5.30: one DaemonSet), so they need no ordering against the monitoring CRDs.
resource "helm_release" "device_plugin" {
  for_each = local.charts

  name       = each.key
  namespace  = "kube-system"
  repository = each.value.repository
  chart      = each.key
  version    = each.value.version
  values     = [file("${path.module}/values/${each.key}.yaml")]
  wait       = true
}

################################################################################
# Kubeflow training operator (v1: PyTorchJob with elasticPolicy)
################################################################################

data "kustomization_build" "training_operator" {
  path = "github.com/kubeflow/trainer.git//manifests/overlays/standalone?ref=${var.training_operator_ref}"
}

# Three phases, as the kustomization provider orders them: namespaces and CRDs first, then the
# rest, then webhooks.
resource "kustomization_resource" "training_operator_p0" {
  for_each = data.kustomization_build.training_operator.ids_prio[0]
  manifest = data.kustomization_build.training_operator.manifests[each.value]
}

resource "kustomization_resource" "training_operator_p1" {
  for_each   = data.kustomization_build.training_operator.ids_prio[1]
  manifest   = data.kustomization_build.training_operator.manifests[each.value]
  depends_on = [kustomization_resource.training_operator_p0]
}

resource "kustomization_resource" "training_operator_p2" {
  for_each   = data.kustomization_build.training_operator.ids_prio[2]
  manifest   = data.kustomization_build.training_operator.manifests[each.value]
  depends_on = [kustomization_resource.training_operator_p1]
}

################################################################################
# Monitoring: kube-prometheus-stack and NVIDIA dcgm-exporter
################################################################################

locals {
  observability = "${path.module}/../../../observability/generated"

  monitoring_charts = {
    # Pins: kube-prometheus-stack 88.5.3 (tag kube-prometheus-stack-88.5.3 of prometheus-community/
    # helm-charts, 2026-08-21, newest), dcgm-exporter 4.8.2 (NVIDIA/dcgm-exporter tag 4.5.3-4.8.2,
    # 2026-05-06, newest; the label names in observability/contract.py are this release's).
    # installs_crds: the chart brings the prometheus-operator CRDs (ServiceMonitor, PodMonitor,
    # PrometheusRule) that the other charts' objects are instances of.
    kube-prometheus-stack = {
      repository    = "https://prometheus-community.github.io/helm-charts"
      version       = "88.5.3"
      installs_crds = true
    }
    dcgm-exporter = {
      repository    = "https://nvidia.github.io/dcgm-exporter/helm-charts"
      version       = "4.8.2"
      installs_crds = false
    }
  }

  # trainkit's alert rules and the training pods' PodMonitor go in through the chart's own values,
  # so nothing of the operator's custom kinds is planned before the chart has installed its CRDs.
  training_pod_monitor = {
    name              = "trainkit-ranks"
    namespaceSelector = { matchNames = [var.jobs_namespace] }
    selector          = { matchLabels = { "app.kubernetes.io/managed-by" = "trainkit" } }
    # No port named: every container port is a target, then only the ranks' metrics ports are kept
    # (metrics-0, metrics-1, ... one per local rank; trainkit/backends/eks/render.py names them).
    podMetricsEndpoints = [{
      interval = "15s"
      relabelings = [{
        action       = "keep"
        sourceLabels = ["__meta_kubernetes_pod_container_port_name"]
        regex        = "metrics-[0-9]+"
      }]
    }]
  }
  monitoring_values = {
    kube-prometheus-stack = yamlencode({
      additionalPrometheusRulesMap = {
        trainkit-alerts = yamldecode(file("${local.observability}/rules/trainkit-alerts.prometheusrule.yaml")).spec
      }
      prometheus = { additionalPodMonitors = [local.training_pod_monitor] }
    })
    dcgm-exporter = yamlencode({})
  }
}

# Two steps, not one for_each: dcgm-exporter's chart renders its ServiceMonitor whenever
# serviceMonitor.enabled is true (no Capabilities check), so on a fresh cluster it must wait for
# kube-prometheus-stack, whose CRDs define that kind; in parallel the apply fails with "resource
# mapping not found ... ensure CRDs are installed first" (tests/unit/test_platform_stack.py).
resource "helm_release" "monitoring_operator" {
  for_each = { for name, chart in local.monitoring_charts : name => chart if chart.installs_crds }

  name       = each.key
  namespace  = var.monitoring_namespace
  repository = each.value.repository
  chart      = each.key
  version    = each.value.version
  values     = [file("${path.module}/values/${each.key}.yaml"), local.monitoring_values[each.key]]
  wait       = true

  depends_on = [kubernetes_manifest.namespace]
}

resource "helm_release" "monitoring" {
  for_each = { for name, chart in local.monitoring_charts : name => chart if !chart.installs_crds }

  name       = each.key
  namespace  = var.monitoring_namespace
  repository = each.value.repository
  chart      = each.key
  version    = each.value.version
  values     = [file("${path.module}/values/${each.key}.yaml"), local.monitoring_values[each.key]]
  wait       = true

  depends_on = [kubernetes_manifest.namespace, helm_release.monitoring_operator]
}

# Grafana's dashboard sidecar loads every ConfigMap labelled grafana_dashboard=1, so the committed
# JSON from observability/ is what the cluster shows.
resource "kubernetes_config_map_v1" "grafana_dashboard" {
  for_each = fileset("${local.observability}/dashboards", "*.json")

  metadata {
    name        = "trainkit-dashboard-${trimsuffix(each.value, ".json")}"
    namespace   = var.monitoring_namespace
    labels      = merge(local.labels, { grafana_dashboard = "1" })
    annotations = { grafana_folder = "trainkit" }
  }

  data = {
    (each.value) = file("${local.observability}/dashboards/${each.value}")
  }

  depends_on = [kubernetes_manifest.namespace]
}

################################################################################
# Idle guard (the infra stack's idle_guard_minutes, default 30; null turns it off)
#
# A CronJob in its own small image (trainkit/backends/eks/idle_guard.py) scales the GPU node group to zero
# after a window without PyTorchJobs or pods that request GPUs and with near-zero DCGM utilisation. Its AWS rights come from the
# infra stack's Pod Identity association for this service account (UpdateNodegroupConfig on that node group
# only); here it gets the Kubernetes reads it needs and its own status ConfigMap and Events.
################################################################################

locals {
  # One instance (key "guard") when the infra stack made the guard's role and `make up` pushed its image.
  idle_guard = try(local.infra.idle_guard, null) != null && var.idle_guard_image != null ? {
    guard = merge(local.infra.idle_guard, { image = var.idle_guard_image })
  } : {}
  idle_guard_name = "trainkit-idle-guard"
}

resource "kubernetes_manifest" "idle_guard_service_account" {
  for_each = local.idle_guard

  manifest = {
    apiVersion = "v1"
    kind       = "ServiceAccount"
    metadata = {
      name      = each.value.service_account
      namespace = each.value.namespace
      labels    = local.labels
    }
  }

  depends_on = [kubernetes_manifest.namespace]
}

# Its status ConfigMap (create, then read and replace it) and an Event when it scales down.
resource "kubernetes_manifest" "idle_guard_status_role" {
  for_each = local.idle_guard

  manifest = {
    apiVersion = "rbac.authorization.k8s.io/v1"
    kind       = "Role"
    metadata = {
      name      = local.idle_guard_name
      namespace = each.value.namespace
      labels    = local.labels
    }
    rules = [
      { apiGroups = [""], resources = ["configmaps"], verbs = ["create"] },
      { apiGroups = [""], resources = ["configmaps"], resourceNames = [local.idle_guard_name], verbs = ["get", "update"] },
      { apiGroups = [""], resources = ["events"], verbs = ["create"] },
    ]
  }

  depends_on = [kubernetes_manifest.namespace]
}

resource "kubernetes_manifest" "idle_guard_status_binding" {
  for_each = local.idle_guard

  manifest = {
    apiVersion = "rbac.authorization.k8s.io/v1"
    kind       = "RoleBinding"
    metadata = {
      name      = local.idle_guard_name
      namespace = each.value.namespace
      labels    = local.labels
    }
    roleRef  = { apiGroup = "rbac.authorization.k8s.io", kind = "Role", name = local.idle_guard_name }
    subjects = [{ kind = "ServiceAccount", name = each.value.service_account, namespace = each.value.namespace }]
  }

  depends_on = [kubernetes_manifest.namespace]
}

# Read-only, cluster-wide: the nodes (how many GPUs should report utilisation), and what counts as activity in
# any namespace: PyTorchJobs and every non-terminal pod that requests nvidia.com/gpu.
resource "kubernetes_manifest" "idle_guard_nodes_role" {
  for_each = local.idle_guard

  manifest = {
    apiVersion = "rbac.authorization.k8s.io/v1"
    kind       = "ClusterRole"
    metadata = {
      name   = local.idle_guard_name
      labels = local.labels
    }
    rules = [
      { apiGroups = [""], resources = ["nodes", "pods"], verbs = ["list"] },
      { apiGroups = ["kubeflow.org"], resources = ["pytorchjobs"], verbs = ["list"] },
    ]
  }
}

resource "kubernetes_manifest" "idle_guard_nodes_binding" {
  for_each = local.idle_guard

  manifest = {
    apiVersion = "rbac.authorization.k8s.io/v1"
    kind       = "ClusterRoleBinding"
    metadata = {
      name   = local.idle_guard_name
      labels = local.labels
    }
    roleRef  = { apiGroup = "rbac.authorization.k8s.io", kind = "ClusterRole", name = local.idle_guard_name }
    subjects = [{ kind = "ServiceAccount", name = each.value.service_account, namespace = each.value.namespace }]
  }
}

resource "kubernetes_manifest" "idle_guard" {
  for_each = local.idle_guard

  manifest = {
    apiVersion = "batch/v1"
    kind       = "CronJob"
    metadata = {
      name      = local.idle_guard_name
      namespace = each.value.namespace
      labels    = local.labels
    }
    spec = {
      # Every 5 minutes: a scale-down comes at most 5 minutes after the window ends; a run takes seconds.
      schedule                   = "*/5 * * * *"
      concurrencyPolicy          = "Forbid"
      successfulJobsHistoryLimit = 1
      failedJobsHistoryLimit     = 3
      jobTemplate = {
        spec = {
          backoffLimit = 0 # the next schedule is the retry
          # Below the 5-minute schedule, so a run that hangs never holds up the next (Forbid). The small image pulls
          # in seconds, but a slow run that still works (up to 15 s per Kubernetes or Prometheus call, EKS calls
          # with botocore's retries) keeps the room it had.
          activeDeadlineSeconds   = 240
          ttlSecondsAfterFinished = 3600
          template = {
            metadata = { labels = merge(local.labels, { "app.kubernetes.io/name" = "trainkit-idle-guard" }) }
            spec = {
              serviceAccountName = each.value.service_account
              restartPolicy      = "Never"
              securityContext = {
                runAsNonRoot   = true
                runAsUser      = 1000
                seccompProfile = { type = "RuntimeDefault" }
              }
              containers = [{
                name    = "idle-guard"
                image   = each.value.image
                command = ["python", "-m", "trainkit.backends.eks.idle_guard"]
                args = [
                  "--cluster=${each.value.cluster_name}",
                  "--nodegroup=${each.value.nodegroup}",
                  "--region=${each.value.region}",
                  "--window-minutes=${each.value.window_minutes}",
                ]
                resources = {
                  requests = { cpu = "100m", memory = "256Mi" }
                  limits   = { cpu = "1", memory = "512Mi" }
                }
                securityContext = {
                  allowPrivilegeEscalation = false
                  readOnlyRootFilesystem   = true
                  capabilities             = { drop = ["ALL"] }
                }
              }]
            }
          }
        }
      }
    }
  }

  depends_on = [kubernetes_manifest.idle_guard_service_account]
}
