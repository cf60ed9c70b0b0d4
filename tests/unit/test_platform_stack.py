"""The platform root (terraform/stacks/platform), checked without its providers.

helm, kubernetes and kustomization cannot be installed here, so `terraform validate` of this root
runs only where the registry is reachable (README, "Train on EKS"). Here: `terraform fmt`
(tests/test_terraform.py, whole tree), checkov and trivy (tests/test_security_scans.py), and these
policy tests over the HCL as python-hcl2 parses it: every chart and image pinned, every values file
present and valid, every Kubernetes object valid for the cluster's version (kubernetes-validate,
strict) once the variables are filled with their defaults and the infra outputs with samples, and
the names the EKS backend relies on (trainkit/cluster.py) are the ones created.
"""

from __future__ import annotations

import re

import hcl2
import kubernetes_validate
import pytest
import yaml

from tests.helpers.kubernetes import kubernetes_version
from tests.helpers.paths import REPO
from trainkit import cluster

ROOT = REPO / "terraform" / "stacks" / "platform"
INFRA_SAMPLE = {  # what the infra stack's outputs look like after `make up PROFILE=aws`
    "fsx_file_system_id": "fs-0123456789abcdef0",
    "fsx_dns_name": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
    "fsx_mount_name": "abcdefgh",
    "fsx_storage_capacity_gib": 2400,
    "gpu_nodes_max": 2,
    "gpus_per_node": 8,
}
EXACT_VERSION = re.compile(r"^v?\d+\.\d+\.\d+$")


def unquote(value):
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def load(name: str) -> dict:
    with (ROOT / name).open() as handle:
        return hcl2.load(handle)


def blocks(parsed: dict, kind: str) -> dict:
    """{(type, name): body} for resource/data blocks, keys unquoted."""
    found = {}
    for block in parsed.get(kind, []):
        for type_name, named in block.items():
            for name, body in named.items():
                found[(unquote(type_name), unquote(name))] = body
    return found


MAIN = load("main.tf")
RESOURCES = blocks(MAIN, "resource")
VARIABLES = {unquote(k): v for block in load("variables.tf")["variable"] for k, v in block.items()}
DEFAULTS = {name: unquote(body.get("default")) for name, body in VARIABLES.items()}
LOCALS = {k: v for block in MAIN["locals"] for k, v in block.items()}


def evaluate(expression: str, context: dict):
    """The few HCL expressions the manifests use: references, tostring(), merge(x, {literal})."""
    if found := re.fullmatch(r"tostring\((.+)\)", expression):
        return str(evaluate(found[1], context))
    if found := re.fullmatch(r"merge\(([\w.]+), \{(.*)\}\)", expression):
        return {**evaluate(found[1], context), **dict(re.findall(r'"([^"]+)" = "([^"]*)"', found[2]))}
    value = context
    for part in expression.split("."):
        value = value[part]
    return value


def resolve(value, context: dict):
    if isinstance(value, dict):
        return {unquote(k): resolve(v, context) for k, v in value.items() if k != "__is_block__"}
    if isinstance(value, list):
        return [resolve(v, context) for v in value]
    if not isinstance(value, str):
        return value
    text = unquote(value)
    if text.startswith("${") and text.endswith("}") and text.count("${") == 1:
        return resolve(evaluate(text[2:-1], context), context)
    return re.sub(r"\$\{([^}]+)\}", lambda m: str(evaluate(m[1], context)), text)


def base_context() -> dict:
    context = {"var": DEFAULTS, "local": {"infra": INFRA_SAMPLE}}
    context["local"]["gpu_quota"] = INFRA_SAMPLE["gpu_nodes_max"] * INFRA_SAMPLE["gpus_per_node"]
    for name in ("labels", "fsx_size", "fsx_claims", "charts", "monitoring_charts", "training_pod_monitor"):
        context["local"][name] = resolve(LOCALS[name], context)
    return context


def instances(body: dict, context: dict):
    """(each.key, each.value) for a resource's for_each, or one instance without it."""
    if "for_each" not in body:
        yield None, None
        return
    expression = unquote(body["for_each"])
    if found := re.fullmatch(r"\$\{toset\(\[(.+)\]\)\}", expression):
        for item in found[1].split(", "):
            value = evaluate(item, context)
            yield value, value
    else:
        yield from resolve(expression, context).items()


def manifests() -> list[tuple[str, dict]]:
    context = base_context()
    rendered = []
    for (kind, name), body in RESOURCES.items():
        if kind != "kubernetes_manifest":
            continue
        for key, value in instances(body, context):
            each = {**context, "each": {"key": key, "value": value}}
            rendered.append((f"{name}[{key}]" if key else name, resolve(body["manifest"], each)))
    return rendered


def test_every_kubernetes_object_is_valid_for_the_clusters_version():
    objects = manifests()
    kinds = sorted({obj["kind"] for _, obj in objects})
    assert kinds == [
        "Namespace",
        "PersistentVolume",
        "PersistentVolumeClaim",
        "ResourceQuota",
        "Service",
        "StatefulSet",
    ]
    for name, obj in objects:
        try:
            kubernetes_validate.validate(obj, kubernetes_version(), strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"kubernetes_manifest.{name}: {error}")


def test_validation_would_catch_a_mistake():
    _, statefulset = next((n, o) for n, o in manifests() if o["kind"] == "StatefulSet")
    statefulset["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, kubernetes_version(), strict=True)


GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_every_chart_is_pinned_and_its_values_file_parses():
    context = base_context()["local"]
    charts = {**context["charts"], **context["monitoring_charts"]}
    releases = [unquote(body["for_each"]) for (kind, _), body in RESOURCES.items() if kind == "helm_release"]
    assert sorted(releases) == ["${local.charts}", "${local.monitoring_charts}"]
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
    from trainkit.render import render_pytorchjob

    monitor = base_context()["local"]["training_pod_monitor"]
    spec = build_spec({"model": "llama2-7b", "nodes": 2, "run_id": "obs"}, profile="aws")
    pod = render_pytorchjob(spec, "rdzv")["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
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


def test_operator_and_images_are_pinned():
    assert EXACT_VERSION.match(DEFAULTS["training_operator_ref"])
    build = blocks(MAIN, "data")[("kustomization_build", "training_operator")]
    assert unquote(build["path"]).endswith("?ref=${var.training_operator_ref}")
    image, _, tag = DEFAULTS["etcd_image"].rpartition(":")
    assert image and re.fullmatch(r"v3\.5\.\d+", tag), "etcd 3.5.x: the v2 API torch's etcd rendezvous needs"


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
    assert "--enable-v2=true" in command  # trainkit-etcd speaks etcd's v2 API
    assert f"--advertise-client-urls=http://{cluster.etcd_endpoint()}" in command
    assert etcd["volumes"][0]["persistentVolumeClaim"]["claimName"] == "fsx-etcd"  # data survives a restart
    quota = objects[("ResourceQuota", "gpus")]
    assert quota["metadata"]["namespace"] == cluster.JOBS_NAMESPACE
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "16"  # 2 nodes x 8 GPUs from the sample outputs
    volume = objects[("PersistentVolume", f"{cluster.JOBS_NAMESPACE}-{cluster.FSX_CLAIM}")]
    assert volume["spec"]["csi"]["volumeHandle"] == INFRA_SAMPLE["fsx_file_system_id"]


def test_providers_take_no_token_into_state():
    text = "\n".join(p.read_text() for p in ROOT.glob("*.tf"))
    assert not re.search(r"data \"aws_eks_cluster_auth\"", text)  # its token would be stored in the state file
    assert text.count('"eks", "get-token"') == 1 and "local.cluster_exec" in text
