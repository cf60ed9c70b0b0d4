"""The platform root (terraform/stacks/platform), checked without its providers.

helm, kubernetes and kustomization cannot be installed here, so `terraform validate` of this root
runs only where the registry is reachable (docs/eks.md). Here: `terraform fmt`
(tests/integration/test_terraform.py, whole tree), checkov and trivy (tests/integration/test_security_scans.py),
every Kubernetes object valid for the cluster's version (tests/integration/test_platform_stack_objects.py,
kubernetes-validate), and these policy tests over the HCL as python-hcl2 parses it (tests/helpers/platform_stack.py):
every chart and image pinned, every values file present and valid, and the names the EKS backend relies on
(trainkit/backends/eks/cluster.py) are the ones created.
"""

from __future__ import annotations

import json
import re

import yaml

from tests.helpers.paths import REPO
from tests.helpers.platform_stack import (
    DEFAULTS,
    IDLE_GUARD_IMAGE,
    INFRA_SAMPLE,
    LOCALS,
    MAIN,
    RESOURCES,
    ROOT,
    base_context,
    blocks,
    etcd_pod,
    manifests,
    selected,
    unquote,
)
from training.text.cache import CACHE_DIR
from trainkit.backends.eks import cluster, fsx
from trainkit.backends.eks.render import render_prep_job

EXACT_VERSION = re.compile(r"^v?\d+\.\d+\.\d+$")


GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_every_chart_is_pinned_and_its_values_file_parses():
    context = base_context()["local"]
    charts = {**context["charts"], **context["monitoring_charts"]}
    releases = sorted(name for kind, name in RESOURCES if kind == "helm_release")
    assert releases == ["device_plugin", "monitoring", "monitoring_operator"]
    assert set(charts) == {
        "nvidia-device-plugin",
        "aws-efa-k8s-device-plugin",
        "kube-prometheus-stack",
        "dcgm-exporter",
    }
    for chart, settings in charts.items():
        assert EXACT_VERSION.match(settings["version"]), f"{chart}: pin one version, not {settings['version']!r}"
        assert settings["repository"].startswith("https://"), chart
        values = yaml.safe_load((ROOT / "values" / f"{chart}.yaml").read_text())
        assert isinstance(values, dict) and values, f"values/{chart}.yaml must be a non-empty mapping"
        # Whatever runs on the GPU nodes must tolerate their taint (Prometheus itself stays off them).
        on_gpu_nodes = values["prometheus-node-exporter"] if chart == "kube-prometheus-stack" else values
        assert GPU_TAINT in on_gpu_nodes.get("tolerations", []), chart
    assert sorted(p.stem for p in (ROOT / "values").glob("*.yaml")) == sorted(charts)  # no stray files


def test_monitoring_scrapes_the_pods_the_backend_renders_and_loads_the_generated_files():
    """The PodMonitor selects what render_pytorchjob produces; rules and dashboards are the committed ones."""
    from trainkit.backends import job_from_flags as build_spec
    from trainkit.backends.eks.render import render_pytorchjob
    from trainkit.workloads.recipe import recipe

    monitor = base_context()["local"]["training_pod_monitor"]
    spec = build_spec({"model": "llama2-7b", "nodes": 2, "run_id": "obs"}, profile="aws")
    pod = render_pytorchjob(spec, "rdzv", recipe(spec))["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    assert monitor["namespaceSelector"]["matchNames"] == [cluster.JOBS_NAMESPACE]
    assert monitor["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    keep = monitor["podMetricsEndpoints"][0]["relabelings"][0]
    assert keep["action"] == "keep" and keep["sourceLabels"] == ["__meta_kubernetes_pod_container_port_name"]
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    kept = {name: port for name, port in ports.items() if re.fullmatch(keep["regex"], name)}
    assert kept == {f"metrics-{r}": spec.run.metrics_port + r for r in range(8)}  # one per rank, not c10d

    text = (ROOT / "main.tf").read_text()
    generated = (ROOT / unquote(LOCALS["observability"]).replace("${path.module}/", "")).resolve()
    assert 'file("${local.observability}/rules/trainkit-alerts.prometheusrule.yaml")' in text
    assert (generated / "rules" / "trainkit-alerts.prometheusrule.yaml").exists()
    assert sorted(p.name for p in (generated / "dashboards").glob("*.json")) == ["gpu-fleet.json", "training-run.json"]
    dashboards = RESOURCES[("kubernetes_config_map_v1", "grafana_dashboard")]
    assert unquote(dashboards["for_each"]) == '${fileset("${local.observability}/dashboards", "*.json")}'
    sidecar = yaml.safe_load((ROOT / "values" / "kube-prometheus-stack.yaml").read_text())["grafana"]["sidecar"]
    assert 'grafana_dashboard = "1"' in dashboards["metadata"][0]["labels"]
    assert (sidecar["dashboards"]["label"], sidecar["dashboards"]["labelValue"]) == ("grafana_dashboard", "1")
    assert DEFAULTS["monitoring_namespace"] == cluster.MONITORING_NAMESPACE
    assert cluster.MONITORING_RELEASE in base_context()["local"]["monitoring_charts"]


def release_of(chart: str) -> tuple[str, dict]:
    """The helm_release (name, body) whose for_each selects `chart`."""
    context = base_context()
    found = [
        (name, body)
        for (kind, name), body in RESOURCES.items()
        if kind == "helm_release" and chart in selected(body, context)
    ]
    assert len(found) == 1, (chart, found)
    return found[0]


def renders_operator_objects(chart: str) -> bool:
    """Whether our values make the chart render a prometheus-operator object (ServiceMonitor/PodMonitor)."""
    values = yaml.safe_load((ROOT / "values" / f"{chart}.yaml").read_text())
    return any(values.get(key, {}).get("enabled") for key in ("serviceMonitor", "podMonitor"))


def test_charts_that_render_monitoring_objects_wait_for_the_crds():
    """dcgm-exporter's chart (templates/service-monitor.yaml at 4.8.2) renders a ServiceMonitor whenever
    serviceMonitor.enabled is true, without asking the cluster whether the kind exists: its release must
    depend on the release that installs the prometheus-operator CRDs, or a fresh `make up` fails."""
    charts = base_context()["local"]["monitoring_charts"]
    providers = [name for name, chart in charts.items() if chart["installs_crds"]]
    assert providers == ["kube-prometheus-stack"]
    provider_release, _ = release_of("kube-prometheus-stack")
    consumers = [c for c in [*charts, *base_context()["local"]["charts"]] if renders_operator_objects(c)]
    assert "dcgm-exporter" in consumers
    for chart in consumers:
        name, body = release_of(chart)
        assert name != provider_release, f"{chart} is installed in the same step as the CRDs it needs"
        assert f"${{helm_release.{provider_release}}}" in body.get("depends_on", []), (chart, body)


def test_operator_and_images_are_pinned():
    """The operator's manifests by commit (a tag can move), the very commit whose CRD and webhook rules the tests
    check every PyTorchJob against (tests/schemas/pytorchjob-v1.json, written by tests/schemas/generate.py)."""
    schema = json.loads((REPO / "tests" / "schemas" / "pytorchjob-v1.json").read_text())
    assert DEFAULTS["training_operator_ref"] == schema["source"]["commit"]
    build = blocks(MAIN, "data")[("kustomization_build", "training_operator")]
    assert unquote(build["path"]).endswith("?ref=${var.training_operator_ref}")
    image, _, tag = DEFAULTS["etcd_image"].rpartition(":")
    assert image and re.fullmatch(r"v3\.5\.\d+", tag), "etcd 3.5.x: the v2 API torch's etcd rendezvous needs"


def test_etcd_keeps_its_data_on_an_encrypted_volume_of_its_own_that_fsgroup_gives_it():
    """Not the FSx every job mounts (issue 49): an EBS volume per the StatefulSet's claim template, gp3, encrypted
    with the stack's key, tagged with the stack's id (the audit of `make down` finds one left behind), deleted with
    the StatefulSet. The EBS CSI driver's fsGroupPolicy is File (aws-ebs-csi-driver chart, templates/
    csidriver.yaml), so the kubelet gives the volume to fsGroup and etcd needs no root step; OnRootMismatch keeps
    its data directory 0700 across restarts (tests/integration/test_platform_etcd_volume.py runs it)."""
    pod = etcd_pod()
    context = pod["securityContext"]
    user = context["runAsUser"]
    assert user != 0 and context["runAsGroup"] == user == context["fsGroup"]
    assert context["fsGroupChangePolicy"] == "OnRootMismatch" and "initContainers" not in pod
    (etcd,) = pod["containers"]
    data, tls = etcd["volumeMounts"]
    assert "subPath" not in data and tls["readOnly"] is True
    assert f"--data-dir={data['mountPath']}/data" in etcd["command"]  # etcd makes it, 0700
    assert etcd["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert data["name"] not in volumes  # the claim template's, not a shared claim
    assert volumes[tls["name"]]["secret"] == {"secretName": cluster.ETCD_SERVER_SECRET, "defaultMode": 0o440}
    objects = {(o["kind"], o["metadata"]["name"]): o for _, o in manifests()}
    statefulset = objects[("StatefulSet", cluster.ETCD_SERVICE)]["spec"]
    (claim,) = statefulset["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == data["name"] and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert statefulset["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"
    storage = objects[("StorageClass", claim["spec"]["storageClassName"])]
    assert storage["provisioner"] == "ebs.csi.aws.com" and storage["reclaimPolicy"] == "Delete"
    assert storage["volumeBindingMode"] == "WaitForFirstConsumer"
    parameters = storage["parameters"]
    assert (parameters["type"], parameters["encrypted"]) == ("gp3", "true")
    assert parameters["kmsKeyId"] == INFRA_SAMPLE["kms_key_arn"]
    assert f"trainkit:stack-id={INFRA_SAMPLE['stack_id']}" in parameters.values()
    assert not any(
        claim.get("namespace") == cluster.PLATFORM_NAMESPACE
        for _, claim in manifests()
        if claim["kind"] == "PersistentVolumeClaim"
    )  # no FSx claim in the platform's namespace


def test_names_match_what_the_eks_backend_uses():
    objects = {(o["kind"], o["metadata"]["name"]): o for _, o in manifests()}
    assert ("Namespace", cluster.JOBS_NAMESPACE) in objects and ("Namespace", cluster.PLATFORM_NAMESPACE) in objects
    claim = objects[("PersistentVolumeClaim", cluster.FSX_CLAIM)]
    assert claim["metadata"]["namespace"] == cluster.JOBS_NAMESPACE and claim["spec"]["accessModes"] == [
        "ReadWriteMany"
    ]
    service = objects[("Service", cluster.ETCD_SERVICE)]
    assert service["metadata"]["namespace"] == cluster.PLATFORM_NAMESPACE
    assert service["spec"]["ports"][0]["port"] == cluster.ETCD_PORT
    etcd = objects[("StatefulSet", cluster.ETCD_SERVICE)]["spec"]["template"]["spec"]
    command = etcd["containers"][0]["command"]
    (tls_dir,) = [m["mountPath"] for m in etcd["containers"][0]["volumeMounts"] if m["name"] == "tls"]
    assert "--enable-v2=true" in command  # trainkit-etcd speaks etcd's v2 API
    assert f"--advertise-client-urls=https://{cluster.etcd_endpoint()}" in command  # TLS only, a certificate each
    assert "--client-cert-auth=true" in command and f"--trusted-ca-file={tls_dir}/ca.crt" in command
    assert f"--listen-metrics-urls=http://0.0.0.0:{cluster.ETCD_METRICS_PORT}" in command  # the probes' port
    assert etcd["containers"][0]["readinessProbe"]["httpGet"]["port"] == cluster.ETCD_METRICS_PORT
    etcd_pod = objects[("StatefulSet", cluster.ETCD_SERVICE)]["spec"]["template"]["spec"]
    assert etcd_pod["automountServiceAccountToken"] is False
    assert etcd_pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert etcd_pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # Only the jobs' namespace and the issuer reach etcd, on its client port.
    policy = objects[("NetworkPolicy", "trainkit-etcd-from-jobs")]
    assert policy["metadata"]["namespace"] == cluster.PLATFORM_NAMESPACE
    assert (
        policy["spec"]["podSelector"]["matchLabels"]
        == objects[("StatefulSet", cluster.ETCD_SERVICE)]["spec"]["selector"]["matchLabels"]
    )
    (rule,) = policy["spec"]["ingress"]
    jobs_namespace = {"kubernetes.io/metadata.name": cluster.JOBS_NAMESPACE}
    issuer = objects[("Deployment", cluster.ETCD_ISSUER)]
    assert issuer["metadata"]["namespace"] == cluster.PLATFORM_NAMESPACE
    issuer_pods = {"podSelector": issuer["spec"]["selector"]}
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": jobs_namespace}}, issuer_pods]
    assert issuer["spec"]["template"]["spec"]["containers"][0]["args"] == [f"--etcd=https://{cluster.etcd_endpoint()}"]
    assert rule["ports"] == [{"protocol": "TCP", "port": cluster.ETCD_PORT}]
    quota = objects[("ResourceQuota", "gpus")]
    assert quota["metadata"]["namespace"] == cluster.JOBS_NAMESPACE
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "16"  # 2 nodes x 8 GPUs from the sample outputs
    account = objects[("ServiceAccount", cluster.DATA_SERVICE_ACCOUNT)]
    assert account["metadata"]["namespace"] == cluster.JOBS_NAMESPACE
    assert account["automountServiceAccountToken"] is False
    volume = objects[("PersistentVolume", f"{cluster.JOBS_NAMESPACE}-{cluster.FSX_CLAIM}")]
    assert volume["spec"]["csi"]["volumeHandle"] == INFRA_SAMPLE["fsx_file_system_id"]
    # The layout Job (what preflight reads) gives the root of that same file system to the jobs' user.
    layout = objects[("Job", cluster.FSX_LAYOUT)]
    assert layout["metadata"]["namespace"] == cluster.PLATFORM_NAMESPACE
    (step,) = layout["spec"]["template"]["spec"]["containers"]
    assert step["command"][-1] == f"--owner={cluster.JOB_UID}:{cluster.JOB_UID}"
    (claim_name,) = [v["persistentVolumeClaim"]["claimName"] for v in layout["spec"]["template"]["spec"]["volumes"]]
    layout_volume = objects[("PersistentVolume", f"{cluster.PLATFORM_NAMESPACE}-{claim_name}")]
    assert layout_volume["spec"]["csi"] == volume["spec"]["csi"]
    assert fsx.TOKENIZED_CACHE.as_posix() == CACHE_DIR.as_posix()  # what pods mount read-write is what runs write
    # Terraform waits for it to complete, and never updates it: a Job's template cannot change (ValidateJobSpecUpdate)
    body = RESOURCES[("kubernetes_manifest", "fsx_layout")]
    assert body["lifecycle"][0]["ignore_changes"] == ["manifest"]
    assert {(c["type"], c["status"]) for c in body["wait"][0]["condition"]} == {('"Complete"', '"True"')}


def test_the_idle_guard_reads_cluster_wide_and_writes_only_in_its_own_namespace():
    """It counts PyTorchJobs and pods requesting GPUs in every namespace (GET /apis/kubeflow.org/v1/pytorchjobs,
    GET /api/v1/pods) and reads the nodes' GPUs: one read-only ClusterRole. Its writes (the status ConfigMap, an
    Event) stay in its own namespace; no Role of its own is left in the jobs namespace."""
    objects = {(o["kind"], o["metadata"]["name"]): o for _, o in manifests()}
    guard = INFRA_SAMPLE["idle_guard"]
    rules = objects[("ClusterRole", cluster.IDLE_GUARD)]["rules"]
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {("", "nodes", "list"), ("", "pods", "list"), ("kubeflow.org", "pytorchjobs", "list")}
    binding = objects[("ClusterRoleBinding", cluster.IDLE_GUARD)]
    assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) == ("ClusterRole", cluster.IDLE_GUARD)
    account = {"kind": "ServiceAccount", "name": guard["service_account"], "namespace": guard["namespace"]}
    assert binding["subjects"] == [account]
    namespaced = [
        o for (kind, name), o in objects.items() if kind in ("Role", "RoleBinding") and name == cluster.IDLE_GUARD
    ]
    assert {o["metadata"]["namespace"] for o in namespaced} == {guard["namespace"]} == {cluster.PLATFORM_NAMESPACE}


def test_providers_take_no_token_into_state():
    text = "\n".join(p.read_text() for p in ROOT.glob("*.tf"))
    assert not re.search(r"data \"aws_eks_cluster_auth\"", text)  # its token would be stored in the state file
    assert text.count('"eks", "get-token"') == 1 and "local.cluster_exec" in text


def test_the_idle_guard_runs_its_own_image_and_only_once_make_up_pushed_it():
    """The CronJob runs var.idle_guard_image (the Dockerfile's stage guard, which `make up` pushes to the guard's
    repository), not the training image; without it there is no CronJob. It runs as the image's own user."""
    condition, _, chosen = unquote(LOCALS["idle_guard"]).partition(" ? ")
    assert "var.idle_guard_image != null" in condition and "{image = var.idle_guard_image}" in chosen
    assert chosen.endswith(" : {}}") and DEFAULTS["idle_guard_image"] is None
    assert "training_image" not in DEFAULTS and "training_image" not in (ROOT / "main.tf").read_text()
    objects = {(o["kind"], o["metadata"]["name"]): o for _, o in manifests()}
    pod = objects[("CronJob", cluster.IDLE_GUARD)]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == IDLE_GUARD_IMAGE
    dockerfile = (ROOT.parents[2] / "containers" / "train" / "Dockerfile").read_text()
    guard_stage = dockerfile[dockerfile.index(" AS guard\n") :]
    (user,) = re.findall(r"^USER (\d+):(\d+)$", guard_stage, flags=re.MULTILINE)
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsNonRoot"]) == (int(user[0]), True)


def test_the_etcd_issuer_runs_the_platforms_image_as_its_user_and_writes_what_the_launcher_reads():
    """The issuer's Deployment runs the same image (only once `make up` pushed it) as the image's own user, one at a
    time; its Roles let it write the two Secrets of trainkit-system it owns (by name, but for create, which RBAC
    cannot limit by name), and in the jobs' namespace list the jobs, write their identity Secrets and its status
    ConfigMap, whose name is the one the launcher reads (preflight.check_etcd_issuer)."""
    condition, _, chosen = unquote(LOCALS["etcd_issuer"]).partition(" ? ")
    assert "var.idle_guard_image != null" in condition and chosen.endswith(" : {}}")
    objects = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")): o for _, o in manifests()}
    system, jobs = cluster.PLATFORM_NAMESPACE, cluster.JOBS_NAMESPACE
    deployment = objects[("Deployment", cluster.ETCD_ISSUER, system)]["spec"]
    pod = deployment["template"]["spec"]
    assert pod["containers"][0]["image"] == IDLE_GUARD_IMAGE and deployment["strategy"] == {"type": "Recreate"}
    assert pod["serviceAccountName"] == cluster.ETCD_ISSUER and pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["command"] == ["python", "-m", "trainkit.backends.eks.etcd_issuer"]
    owned = objects[("Role", cluster.ETCD_ISSUER, system)]["rules"][1]
    assert owned["resourceNames"] == [cluster.ETCD_CA_SECRET, cluster.ETCD_SERVER_SECRET]
    rules = objects[("Role", cluster.ETCD_ISSUER, jobs)]["rules"]
    assert {"resources": ["pytorchjobs"], "verbs": ["list"], "apiGroups": ["kubeflow.org"]} in rules
    assert any(rule.get("resourceNames") == [cluster.ETCD_ISSUER] for rule in rules)
    for namespace in (system, jobs):
        binding = objects[("RoleBinding", cluster.ETCD_ISSUER, namespace)]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": cluster.ETCD_ISSUER, "namespace": system}]


def test_grafana_reads_configmaps_and_secrets_only_in_its_own_namespace():
    """The grafana chart (a subchart of the pinned kube-prometheus-stack) grants its dashboard and datasource
    sidecars get/list/watch on configmaps and secrets: in a ClusterRole unless `rbac.namespaced` (templates/
    clusterrole.yaml: `if and .Values.rbac.create (not .Values.rbac.namespaced)`), else in a Role of its namespace
    (templates/role.yaml). So Grafana must be namespaced, search only its own namespace (values.yaml: no
    searchNamespace means the sidecar's), and the dashboards must be created there."""
    grafana = yaml.safe_load((ROOT / "values" / "kube-prometheus-stack.yaml").read_text())["grafana"]
    assert grafana["rbac"]["namespaced"] is True
    for sidecar in grafana["sidecar"].values():
        assert sidecar.get("searchNamespace") in (None, ""), "a namespace beyond its own needs the ClusterRole"
    assert unquote(RESOURCES[("helm_release", "monitoring_operator")]["namespace"]) == "${var.monitoring_namespace}"
    dashboards = RESOURCES[("kubernetes_config_map_v1", "grafana_dashboard")]["metadata"][0]
    assert unquote(dashboards["namespace"]) == "${var.monitoring_namespace}"


def test_the_jobs_namespace_admits_the_workers_and_refuses_what_reaches_the_node():
    """The platform's ValidatingAdmissionPolicy, its CEL run as the API server runs it (tests/helpers/admission.py):
    a rendered worker (its init container, the FSx claim, the jobs' user) and data job are admitted; each way to the
    node, and root, is refused with its message, in the jobs' namespace only."""
    import copy

    from tests.helpers.admission import denial
    from tests.helpers.eks import job_for

    objects = [m for _, m in manifests() if m["kind"].startswith("ValidatingAdmissionPolicy")]
    template = job_for({"model": "llama2-7b", "run_id": "vap"})["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    worker = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vap-worker-0", **template["metadata"]}}
    worker["spec"] = template["spec"]
    assert denial(objects, "trainkit-jobs", worker) is None
    prep = render_prep_job("prep", "trainkit-jobs", "img", [], "dest", None)["spec"]["template"]
    assert denial(objects, "trainkit-jobs", {"metadata": {"name": "prep-0"}, "spec": prep["spec"]}) is None

    def changed(edit) -> dict:
        pod = copy.deepcopy(worker)
        edit(pod["spec"])
        return pod

    cases = {
        "(hostNetwork, hostPID, hostIPC)": lambda s: s.update(hostNetwork=True),
        "hostPID": lambda s: s.update(hostPID=True),
        "(hostPath volumes)": lambda s: s["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
        "run privileged": lambda s: s.update(
            initContainers=[{"name": "i", "image": "x", "securityContext": {"privileged": True}}]
        ),
        "(hostPort)": lambda s: s["containers"][0]["ports"].append({"containerPort": 22, "hostPort": 22}),
        "baseline's capabilities": lambda s: s["containers"][0]["securityContext"]["capabilities"].update(
            add=["SYS_ADMIN"]
        ),
        "unmask /proc": lambda s: s["containers"][0]["securityContext"].update(procMount="Unmasked"),
        "may not run without seccomp": lambda s: s["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "an SELinux type": lambda s: s["containers"][0]["securityContext"].update(seLinuxOptions={"type": "spc_t"}),
        "set a sysctl": lambda s: s["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
        # root: the image's own user (none asked), one container's, or uid 0 asked outright
        "must run as a non-root user": lambda s: [s["securityContext"].pop(k) for k in ("runAsNonRoot", "runAsUser")],
        "non-root user: set": lambda s: s["initContainers"][0]["securityContext"].update(runAsNonRoot=False),
        "a non-zero runAsUser": lambda s: s["containers"][0]["securityContext"].update(runAsUser=0),
    }
    for said, edit in cases.items():
        refused = denial(objects, "trainkit-jobs", changed(edit))
        assert refused and said in refused, (said, refused)
        assert refused.startswith(
            "pods \"vap-worker-0\" is forbidden: ValidatingAdmissionPolicy 'trainkit-jobs-pods' with binding "
            "'trainkit-jobs-pods' denied request: "
        )
    assert denial(objects, "trainkit-system", changed(cases["(hostNetwork, hostPID, hostIPC)"])) is None


def test_submitters_get_pytorchjobs_in_the_jobs_namespace_and_the_node_list_and_nothing_more():
    """The EKS access policies a submitter holds (AmazonEKSEditPolicy in the jobs' namespace, View in this one: the
    eks module) have neither PyTorchJobs nor nodes; the group their access entries carry (the module's default
    name, which the sample's output repeats) gets exactly those."""
    import hcl2

    from tests.helpers.paths import REPO

    with (REPO / "terraform" / "modules" / "eks" / "variables.tf").open() as handle:
        variables = {unquote(k): v for block in hcl2.load(handle)["variable"] for k, v in block.items()}
    group = re.search(r'kubernetes_group\s*=\s*optional\(string, "([^"]+)"\)', str(variables["submitter_access"]))
    assert group and group[1] == INFRA_SAMPLE["submitters"]["kubernetes_group"]
    bound = {m["kind"]: m for n, m in manifests() if n.startswith("submitter_")}
    assert {s["name"] for k in ("RoleBinding", "ClusterRoleBinding") for s in bound[k]["subjects"]} == {group[1]}
    assert bound["Role"]["metadata"]["namespace"] == cluster.JOBS_NAMESPACE
    assert bound["Role"]["rules"] == [
        {
            "apiGroups": ["kubeflow.org"],
            "resources": ["pytorchjobs"],
            "verbs": ["create", "get", "list", "watch", "delete"],
        }
    ]
    assert bound["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]
