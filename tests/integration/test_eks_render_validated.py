"""EKS job rendering checked by real tools: `--dry-run` through the command line, golden manifests, and
schema checks. Core kinds are validated with kubernetes-validate (strict) for the cluster's Kubernetes
version; the PyTorchJob against training-operator v1.9.4's own CRD schema and webhook rules
(tests/helpers/crd.py)."""

from __future__ import annotations

import copy
import json
import os

import kubernetes_validate
import pytest
import yaml
from kubernetes.utils import parse_quantity

from tests.helpers.crd import admission_errors
from tests.helpers.eks import container, dry_run_job, job_for, validate_core, worker
from tests.helpers.kubernetes import kubernetes_version
from tests.helpers.paths import GOLDEN, REPO
from tests.helpers.pod_resources import DAEMONSET_REQUESTS, misfits, node_allocatable, qos_class, resource_errors
from tests.helpers.product import invoke
from trainkit import hardware
from trainkit.backends.eks import cluster, render
from trainkit.run.secrets import CREDENTIALS
from trainkit.run.workload import WORKLOAD_ENV

TOKEN = "hf_do_not_leak_0123456789abcdef"


def test_dry_run_llama2_7b_on_two_p5_nodes_prints_the_job_and_no_token(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    env = {"HF_TOKEN": TOKEN, "TRAINKIT_STATE_DIR": str(tmp_path / "state"), "KUBECONFIG": str(tmp_path / "none")}
    result = invoke(
        "train",
        "--model",
        "llama2-7b",
        "--target",
        "eks",
        "--nodes",
        "2",
        "--dry-run",
        "--hf-token-file",
        str(token_file),
        *("--track", "mlflow", "--tracking-uri", "http://127.0.0.1:9"),  # nothing answers there: a note, not a refusal
        env={**env, "MLFLOW_TRACKING_TOKEN": TOKEN},
    )
    assert result.returncode == 0, result.stderr
    assert TOKEN not in result.stdout + result.stderr
    assert "no MLflow server answers from this machine" in result.stderr
    job = dry_run_job(result.stdout)  # stdout is only the YAML; notes go to stderr
    assert "assuming p5.48xlarge" in result.stderr and "rendezvous: etcd" in result.stderr
    assert admission_errors(job) is None, admission_errors(job)
    validate_core(job)
    requests = container(job)["resources"]["requests"]
    assert requests == container(job)["resources"]["limits"]
    assert (requests["nvidia.com/gpu"], requests["vpc.amazonaws.com/efa"], requests["hugepages-2Mi"]) == (
        "8",
        "32",
        "5120Mi",
    )
    assert qos_class(worker(job)["template"]["spec"]) == "Guaranteed"
    assert worker(job)["replicas"] == 2 and job["spec"]["nprocPerNode"] == "8"
    pod = worker(job)["template"]["spec"]
    assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    # Least privilege: no API token, the jobs' user, no escalation, no capability (the GPU nodes raise memlock for
    # EFA's pinned memory instead), the runtime's seccomp.
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": cluster.JOB_UID,
        "runAsGroup": cluster.JOB_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for each in [*pod["initContainers"], container(job)]:
        assert each["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    claims = {v["name"]: v for v in pod["volumes"]}
    assert claims["fsx"]["persistentVolumeClaim"]["claimName"] == cluster.FSX_CLAIM
    assert claims["dshm"]["emptyDir"]["medium"] == "Memory"
    # FSx read-only but for the run's folder and the shared cache (what each allows: tests/integration/
    # test_fsx_ownership.py); the init container, which makes them, mounts it all.
    fsx_mounts = [m for m in container(job)["volumeMounts"] if m["name"] == "fsx"]
    assert fsx_mounts[0] == {"name": "fsx", "mountPath": "/fsx", "readOnly": True}
    assert {m.get("subPath") for m in fsx_mounts[1:]} == {
        f"runs/{job['metadata']['annotations']['trainkit/run-id']}",
        "runs/.cache/tokenized",
    }
    assert pod["initContainers"][0]["volumeMounts"] == [{"name": "fsx", "mountPath": "/fsx"}]
    env_vars = {item["name"]: item for item in container(job)["env"]}
    assert env_vars["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == cluster.HF_TOKEN_SECRET
    assert "value" not in env_vars["HF_TOKEN"]
    # The MLflow server's token from its Secret, if stored: a server may want none (the pods then start without it).
    mlflow_token = {"name": "mlflow-token", "key": cluster.SECRET_KEY, "optional": True}
    assert env_vars["MLFLOW_TRACKING_TOKEN"] == {
        "name": "MLFLOW_TRACKING_TOKEN",
        "valueFrom": {"secretKeyRef": mlflow_token},
    }
    for name, value in render.NCCL_EFA_ENV.items():
        assert env_vars[name]["value"] == value
    policy = job["spec"]["elasticPolicy"]
    assert (
        policy["rdzvBackend"] == "etcd"
        and policy["rdzvHost"] == f"{cluster.ETCD_SERVICE}.{cluster.PLATFORM_NAMESPACE}.svc"
    )
    assert policy["rdzvPort"] == cluster.ETCD_PORT and (policy["minReplicas"], policy["maxReplicas"]) == (2, 2)
    assert pod["terminationGracePeriodSeconds"] >= 30 + 15  # torchrun's stop grace plus a checkpoint margin
    labels = job["metadata"]["labels"]
    assert labels[render.LABEL_MODEL] == "llama2-7b" and labels[render.LABEL_RUN].startswith("llama2-7b-")
    assert not (REPO / "runs" / labels[render.LABEL_RUN]).exists()  # a dry run writes nothing locally


@pytest.mark.parametrize(
    "name, flags",
    [
        ("llama2-7b-2xp5", {"model": "llama2-7b", "nodes": "2", "run_id": "golden-llama"}),
        (
            "resnet50-4xp4d",
            {
                "model": "resnet50",
                "nodes": "4",
                "instance_type": "p4d.24xlarge",
                "run_id": "golden-resnet",
                "rdzv": "c10d",
            },
        ),
    ],
)
def test_golden_manifests(recorded_outputs, name, flags):
    """Regenerate with TRAINKIT_UPDATE_GOLDEN=1 after an intended change, and review the diff."""
    text = yaml.safe_dump(job_for(flags), sort_keys=False, width=120)
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("TRAINKIT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs from the rendered job"
    job = yaml.safe_load(text)
    assert admission_errors(job) is None, admission_errors(job)
    validate_core(job)
    gpus = hardware.INSTANCE_TYPES[flags.get("instance_type", "p5.48xlarge")]
    assert container(job)["resources"]["limits"]["vpc.amazonaws.com/efa"] == str(gpus.efa_interfaces)
    assert container(job)["resources"]["limits"]["nvidia.com/gpu"] == str(gpus.gpus)


@pytest.mark.parametrize("instance_type", sorted(hardware.INSTANCE_TYPES))
def test_workers_are_guaranteed_and_fit_their_node_beside_its_daemonsets(instance_type):
    """Issue 48: a worker asks for the whole node (GPUs, EFA devices, EFA's hugepages, CPU and memory), requests equal
    to limits, so Kubernetes makes the pod Guaranteed; and the scheduler fits it, with the GPU nodes' DaemonSets, in
    what the node's kubelet makes allocatable (tests/helpers/pod_resources.py, from Kubernetes' and the AMI's code)."""
    job = job_for({"model": "llama2-7b", "instance_type": instance_type, "run_id": "sized"})
    pod, resources = worker(job)["template"]["spec"], container(job)["resources"]
    instance = hardware.INSTANCE_TYPES[instance_type]
    assert resource_errors(container(job)) == [] and qos_class(pod) == "Guaranteed"
    assert resources["requests"] == resources["limits"]
    whole = {"nvidia.com/gpu": str(instance.gpus), "vpc.amazonaws.com/efa": str(instance.efa_interfaces)}
    assert {name: resources["requests"][name] for name in whole} == whole
    assert resources["requests"]["hugepages-2Mi"] == "5120Mi"  # the EKS EFA guide's example worker
    allocatable = node_allocatable(instance_type)
    assert misfits([resources["requests"], *DAEMONSET_REQUESTS], allocatable) == {}
    # Nearly all of the node: what stays unasked is the margin for the DaemonSets' and the node's own use.
    left = {name: allocatable[name] - parse_quantity(resources["requests"][name]) for name in ("cpu", "memory")}
    assert left["cpu"] <= 3 and left["memory"] <= 10 * 2**30, left


def test_the_qos_and_resource_rules_tell_the_old_workers_apart():
    """The rules in tests/helpers/pod_resources.py find what the workers were before (GPUs and EFA devices only:
    BestEffort) and the mistakes the API server refuses."""
    devices = {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}
    assert qos_class({"containers": [{"resources": {"requests": devices, "limits": devices}}]}) == "BestEffort"
    burstable = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
    assert qos_class({"containers": [{"resources": burstable}]}) == "Burstable"
    assert qos_class({"containers": [{"resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}]}) == "Guaranteed"
    hugepages_only = {"requests": {"hugepages-2Mi": "5120Mi"}, "limits": {"hugepages-2Mi": "5120Mi"}}
    assert resource_errors({"resources": hugepages_only}) == ["resources: HugePages require cpu or memory"]
    fewer = {"requests": {"nvidia.com/gpu": "4"}, "limits": {"nvidia.com/gpu": "8"}}
    assert resource_errors({"resources": fewer}) == ["requests.nvidia.com/gpu: must be equal to nvidia.com/gpu limit"]


def test_schema_and_core_validation_catch_mistakes(recorded_outputs):
    job = job_for({"model": "llama2-7b"})
    misspelt = copy.deepcopy(job)
    misspelt["spec"]["elasticPolicy"]["rdzvBackned"] = "etcd"
    code, message = admission_errors(misspelt)
    assert code == 422 and "rdzvBackned" in message
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["runPolicy"]["backoffLimit"] = "3"
    assert admission_errors(wrong_type)[0] == 422
    renamed = copy.deepcopy(job)  # the operator finds its container by name
    container(renamed)["name"] = "trainer"
    code, message = admission_errors(renamed)
    assert code == 400 and "must have at least one container with name pytorch" in message
    no_workers = copy.deepcopy(job)
    worker(no_workers)["replicas"] = 0
    assert "Worker].replicas: Forbidden: must be at least 1" in admission_errors(no_workers)[1]
    no_image = copy.deepcopy(job)
    container(no_image)["image"] = ""
    assert "image: Required value" in admission_errors(no_image)[1]
    bad_pod = copy.deepcopy(job)
    container(bad_pod)["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_core(bad_pod)


def test_credential_secrets_are_valid_secrets_and_the_only_objects_with_the_token():
    for credential in CREDENTIALS:
        secret = render.render_secret(credential, TOKEN, cluster.JOBS_NAMESPACE)
        kubernetes_validate.validate(secret, kubernetes_version(), strict=True)
        assert secret["stringData"][cluster.SECRET_KEY] == TOKEN and secret["metadata"]["name"] == credential.name


def test_local_dry_run_prints_the_job_and_creates_nothing(tmp_path):
    """Every backend has a dry run (trainkit/backends/README.md); the local one prints the spec.json it would write."""
    runs = tmp_path / "runs"
    result = invoke(
        "train",
        "--model",
        "llama2-tiny",
        "--runs-dir",
        str(runs),
        "--dry-run",
        env={"TRAINKIT_STATE_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["placement"]["target"] == "local" and job["model"]["name"] == "llama2-tiny"
    assert not runs.exists()


def test_nccl_test_dry_run_is_a_job_on_the_training_placement_that_runs_the_sweep(tmp_path):
    """`invoke nccl-test --target eks --dry-run`: the same pods as a training job on p5 (8 GPUs, 32 EFA devices,
    node selector, security, FSx), admitted by the operator's CRD and webhook rules and valid as a core pod;
    the workers run the pod entry point on the sweep, which expects EFA and the published busbw, retried never."""
    env = {"TRAINKIT_STATE_DIR": str(tmp_path / "state"), "KUBECONFIG": str(tmp_path / "none")}
    result = invoke("nccl-test", "--target", "eks", "--nodes", "2", "--run-id", "fabric", "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    job = dry_run_job(result.stdout)
    assert admission_errors(job) is None, admission_errors(job)
    validate_core(job)
    trained = job_for({"model": "llama2-7b", "nodes": "2", "run_id": "fabric"})
    for key in ("resources", "securityContext", "volumeMounts", "workingDir", "image"):
        assert container(job)[key] == container(trained)[key], key
    limits = container(job)["resources"]["limits"]
    assert (limits["nvidia.com/gpu"], limits["vpc.amazonaws.com/efa"]) == ("8", "32")
    pod, trained_pod = worker(job)["template"]["spec"], worker(trained)["template"]["spec"]
    assert {k: v for k, v in pod.items() if k != "containers"} == {
        k: v for k, v in trained_pod.items() if k != "containers"
    }
    assert worker(job)["restartPolicy"] == "Never" and job["spec"]["runPolicy"]["backoffLimit"] == 0
    assert job["spec"]["elasticPolicy"]["minReplicas"] == job["spec"]["elasticPolicy"]["maxReplicas"] == 2
    assert job["metadata"]["labels"][render.LABEL_MODEL] == "nccl-test"
    assert job["spec"]["elasticPolicy"]["maxRestarts"] == 0
    # The pod entry point, as for every workload (a failed sweep's cause reaches `invoke status`), on the sweep.
    assert container(job)["command"] == render.POD_ENTRY
    env = {item["name"]: item.get("value") for item in container(job)["env"]}
    workload = json.loads(env[WORKLOAD_ENV])
    assert (workload["module"], workload["restarts"]) == ("training.comms.sweep", False)
    sweep = workload["args"]
    assert sweep[:2] == ["--out", "runs/fabric"]
    assert "--expect-efa" in sweep and sweep[sweep.index("--expect-busbw") + 1] == f"{2 * 2**30}:443.7"
    assert sweep[sweep.index("--max-bytes") + 1] == str(16 * 2**30)  # GPUs: nccl-tests' usual 8 B .. 16 GiB
    spec = json.loads(env["TRAINKIT_SPEC"])
    assert (spec["parallelism"]["nodes"], spec["parallelism"]["nproc"], spec["run"]["workload"]) == (2, 8, "nccl-test")
    assert set(render.NCCL_EFA_ENV) <= set(env) and "HF_TOKEN" not in env  # the sweep never reads the token


def test_nccl_test_flags_of_the_cluster_are_refused_locally():
    result = invoke("nccl-test", "--target", "local", "--image", "x", "--dry-run")
    said = "--image x is for --target eks, sagemaker or batch; drop it (or add --target)"
    assert result.returncode == 2 and said in result.stderr
