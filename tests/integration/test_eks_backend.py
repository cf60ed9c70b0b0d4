"""The EKS backend against a local Kubernetes API server (tests/helpers/kube_api.py, the `fake` fixture).

Preflight failures each end in one sentence naming the fix; `invoke secrets.hf-token` and `invoke status`
against the cluster. A real job through the same server: tests/e2e/test_eks_backend_runs.py.
"""

from __future__ import annotations

import json
import socket

import pytest
from moto import mock_aws

from tests.helpers.ecr_blobs import EcrBlobs
from tests.helpers.eks import IMAGE
from tests.helpers.product import invoke
from trainkit.backends import job_from_flags as build_spec
from trainkit.backends.eks import backend as eks
from trainkit.backends.eks import cluster, image, preflight
from trainkit.backends.eks.etcd_issuer import STATUS_PASSED
from trainkit.backends.eks.kube import Kube
from trainkit.errors import SpecError
from trainkit.infra import outputs
from trainkit.plan.prices import table
from trainkit.workloads.recipe import recipe

TOKEN = "hf_never_print_me_42"
GUARD = {"cluster_name": "trainkit", "region": "us-east-1", "nodegroup": "gpu", "window_minutes": 30}


def spec_of(**flags):
    return build_spec({"target": "eks", "model": "llama2-7b", "image": IMAGE, **flags})


def check(**flags) -> list[str]:
    return preflight.preflight(Kube.connect(), spec_of(**flags))


def test_preflight_passes_on_a_ready_cluster(fake):
    (note,) = check(nodes="2")
    assert note.startswith(f"image {IMAGE} is not in ECR; not checked (the nodes must be able to pull it, and it must ")


def test_unreachable_cluster(fake, monkeypatch, tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = json.loads(fake.kubeconfig().read_text())
    config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{port}"
    path = tmp_path / "dead-kubeconfig"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    with pytest.raises(
        SpecError, match=rf"cannot reach the Kubernetes API at http://127.0.0.1:{port} .*run `make up PROFILE=aws`"
    ):
        check()


def test_no_kubeconfig(fake, monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(SpecError, match=r"no kubeconfig at .*missing: run `make up PROFILE=aws` \(it writes one\)"):
        check()


def test_operator_missing(fake):
    fake.operator_installed = False
    with pytest.raises(SpecError, match=r"no PyTorchJob kind \(kubeflow.org/v1\): run `make up PROFILE=aws`"):
        check()


def test_not_enough_gpu_nodes(fake):
    """Without a `make up` recorded on this machine the launcher knows no node group to ask (with one, it asks:
    tests/integration/test_idle_guard.py); Terraform sets the node group's desired size only when it creates it, so
    the advice is to submit where the outputs are, or to scale the group, not to change gpu_desired_nodes."""
    with pytest.raises(SpecError) as refused:
        check(nodes="3", global_batch_size="48", micro_batch_size="1")
    assert str(refused.value) == (
        "the job needs 3 p5.48xlarge node(s) with 8 GPUs and 32 EFA devices allocatable each and the cluster has 2, "
        "and no `make up PROFILE=aws` on this machine recorded the GPU node group to ask for them: submit from the "
        f"machine that ran it (or copy its outputs.json here, to {outputs.outputs_path()}), ask for fewer with "
        "--nodes 2, or scale the group yourself (Terraform sets its desired size only when it creates it): `aws eks "
        "update-nodegroup-config --cluster-name <cluster_name> --nodegroup-name gpu --scaling-config desiredSize=3` "
        "(cluster_name as `make up` printed it), at most gpu_max_nodes (terraform/stacks/infra/terraform.tfvars)"
    )
    assert (
        "the job starts with at most 2 and grows" in check(nodes="1:3", global_batch_size="48", micro_batch_size="1")[0]
    )  # elastic: the minimum is enough


def test_nodes_of_another_type_do_not_count(fake):
    with pytest.raises(SpecError, match=r"needs 1 p4d.24xlarge node\(s\) .* the cluster has 0"):
        check(instance_type="p4d.24xlarge")
    outputs.save_outputs({"gpu_instance_type": "p5.48xlarge", "region": "us-east-1"})  # what `make up` made
    with pytest.raises(
        SpecError,
        match=r"^the job asks for p4d.24xlarge nodes and the GPU node group has p5.48xlarge: leave --instance-type "
        r'out, or set gpu_instance_type = "p4d.24xlarge" in terraform/stacks/infra/terraform.tfvars and run `make up',
    ):
        check(instance_type="p4d.24xlarge")


@pytest.mark.parametrize("phase, shown", [(None, "missing"), ("Pending", "Pending")])
def test_fsx_claim_not_bound(fake, phase, shown):
    fake.claim_phase = phase
    with pytest.raises(
        SpecError, match=rf"FSx volume claim trainkit-jobs/fsx-shared is {shown}, not Bound: run `make up"
    ):
        check()


def test_a_job_needs_the_platforms_fsx_layout_to_have_given_the_root_to_the_jobs_user(fake):
    """The pods run as the jobs' user over a root-squashed FSx: until the platform's layout Job completed, their
    run folder could not be made, so the launcher refuses and says where to look."""
    done = fake.batch_jobs.pop((cluster.PLATFORM_NAMESPACE, cluster.FSX_LAYOUT))
    with pytest.raises(SpecError, match=r"^the platform's FSx layout step \(trainkit-system/trainkit-fsx-layout\) "):
        check()
    failed = json.loads(json.dumps(done))
    failed["status"] = {"failed": 4, "conditions": [{"type": "Failed", "status": "True"}]}
    fake.batch_jobs[(cluster.PLATFORM_NAMESPACE, cluster.FSX_LAYOUT)] = failed
    with pytest.raises(SpecError) as refused:
        check()
    assert "trainkit-fsx-layout) failed, so the FSx root is not the jobs' user's (1000)" in str(refused.value)
    assert "`kubectl -n trainkit-system logs job/trainkit-fsx-layout`, then run `make up PROFILE=aws`" in str(
        refused.value
    )
    fake.batch_jobs[(cluster.PLATFORM_NAMESPACE, cluster.FSX_LAYOUT)] = done
    check()


def test_an_etcd_job_needs_the_platforms_etcd_issuer_to_have_run(fake):
    """Its pods mount the identity the issuer writes (tests/integration/test_etcd_identities.py): without an issuer
    they would wait for it for good, so the launcher refuses; an issuer that stopped passing is a note."""
    status = fake.configmaps.pop((cluster.JOBS_NAMESPACE, cluster.ETCD_ISSUER))
    with pytest.raises(SpecError) as refused:
        check()
    assert str(refused.value).startswith(
        "the platform's etcd issuer has never run (no ConfigMap trainkit-jobs/trainkit-etcd-issuer), so an etcd "
        "job's pods would get no etcd identity and wait: it runs in the platform's image, which `make up PROFILE=aws` "
        "builds and pushes"
    )
    assert str(refused.value).endswith("or use --rdzv c10d")
    check(rdzv="c10d")  # a job with no etcd needs no issuer
    check(rdzv_endpoint="etcd.example.com:2379")  # nor one at an etcd of the user's own
    fake.configmaps[(cluster.JOBS_NAMESPACE, cluster.ETCD_ISSUER)] = status
    status["data"][STATUS_PASSED] = "2026-01-01T00:00:00+00:00"
    stale = [note for note in check() if "etcd issuer" in note]
    assert stale and stale[0].startswith("the platform's etcd issuer last ran ")
    assert "kubectl -n trainkit-system logs deploy/trainkit-etcd-issuer" in stale[0]


def test_pretrained_needs_the_token_secret(fake):
    with pytest.raises(SpecError, match=r"no Secret trainkit-jobs/hf-token: run `invoke secrets.hf-token` first"):
        check(init="pretrained")
    fake.secrets[("trainkit-jobs", "hf-token")] = {"token": TOKEN}
    check(init="pretrained")


def test_a_running_job_of_the_same_run_is_refused(fake):
    spec = spec_of()
    eks.submit(spec, recipe(spec))
    with pytest.raises(
        SpecError, match=rf"run {spec.run.run_id} already has a job .* `invoke stop --run-id {spec.run.run_id}`"
    ):
        check()


ENTRY = {image.POD_ENTRY_LABEL: image.POD_ENTRY_MODULE}


@pytest.fixture
def ecr(monkeypatch, tmp_path):
    """An ECR repository like ours in the AWS emulator, with its blobs (tests/helpers/ecr_blobs.py)."""
    import boto3

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws(), EcrBlobs(tmp_path / "blobs") as blobs:
        client = boto3.client("ecr", region_name="us-east-1")
        created = client.create_repository(repositoryName="trainkit/train", imageTagMutability="IMMUTABLE")  # as ours
        yield client, blobs, created["repository"]["repositoryUri"]


def test_image_must_exist_in_ecr(fake, ecr):
    ecr, blobs, url = ecr
    spec = spec_of(image=f"{url}:v1")
    with pytest.raises(SpecError, match=rf"image {url}:v1 is not in ECR \(ImageNotFoundException\): build and push it"):
        image.check_image(spec, ecr)
    blobs.push(ecr, "trainkit/train", "v1", ENTRY)
    assert image.check_image(spec, ecr) is None
    # the image now also carries the run's tag, which the lifecycle policy keeps (terraform/modules/ecr)
    (pushed,) = ecr.describe_images(repositoryName="trainkit/train")["imageDetails"]
    assert sorted(pushed["imageTags"]) == sorted(["v1", f"run-{spec.run.run_id}"])
    assert image.check_image(spec, ecr) is None  # submitting again: the tag is there already
    blobs.push(ecr, "trainkit/train", "v2", ENTRY)  # a resumed run on another image: its first one stays kept
    note = image.check_image(spec_of(image=f"{url}:v2"), ecr)
    assert note and f"run-{spec.run.run_id} already tags the image this run started with" in note
    with pytest.raises(SpecError, match=r"RepositoryNotFoundException"):
        image.check_image(spec_of(image=url.replace("trainkit/train", "nope") + ":v1"), ecr)


def test_an_image_without_the_pod_entry_point_is_refused_before_anything_is_tagged(fake, ecr):
    ecr, blobs, url = ecr
    blobs.push(ecr, "trainkit/train", "plain", {"maintainer": "someone"})
    blobs.push(ecr, "trainkit/train", "other", {image.POD_ENTRY_LABEL: "their.entry"})
    with pytest.raises(
        SpecError,
        match=rf"image {url}:plain does not hold trainkit's pod entry point \(it has no dev.trainkit.pod-entry "
        r"label; the pods run `python -m trainkit.backends.eks.pod`\): build it FROM trainkit's training image",
    ):
        image.check_image(spec_of(image=f"{url}:plain"), ecr)
    with pytest.raises(SpecError, match=r"its label dev.trainkit.pod-entry is 'their.entry'"):
        image.check_image(spec_of(image=f"{url}:other"), ecr)
    (plain,) = ecr.describe_images(repositoryName="trainkit/train", imageIds=[{"imageTag": "plain"}])["imageDetails"]
    assert plain["imageTags"] == ["plain"]  # refused: no run tag keeps it
    blobs.push(ecr, "trainkit/train", "laptop", ENTRY, architecture="arm64")  # built on an arm64 laptop
    with pytest.raises(
        SpecError, match=r":laptop is built for linux/arm64 and the GPU nodes run linux/amd64: build it"
    ):
        image.check_image(spec_of(image=f"{url}:laptop"), ecr)


def test_an_image_index_is_checked_by_its_linux_amd64_image(fake, ecr):
    ecr, blobs, url = ecr
    arm = blobs.push(ecr, "trainkit/train", "arm", {})
    amd = blobs.push(ecr, "trainkit/train", "amd", ENTRY)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": arm,
                "size": 1,
                "platform": {"os": "linux", "architecture": "arm64"},
            },
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": amd,
                "size": 1,
                "platform": {"os": "linux", "architecture": "amd64"},
            },
        ],
    }
    ecr.put_image(repositoryName="trainkit/train", imageManifest=json.dumps(index), imageTag="multi")
    assert image.check_image_ref(f"{url}:multi", ecr)[0] is None
    index["manifests"].pop()
    ecr.put_image(repositoryName="trainkit/train", imageManifest=json.dumps(index), imageTag="arm-only")
    with pytest.raises(SpecError, match=r"has no linux/amd64 image, the GPU nodes' platform"):
        image.check_image_ref(f"{url}:arm-only", ecr)


def test_a_config_that_does_not_match_its_digest_is_not_trusted(fake, ecr):
    ecr, blobs, url = ecr
    blobs.push(ecr, "trainkit/train", "v1", ENTRY)
    for blob in blobs.folder.iterdir():
        if b"Labels" in blob.read_bytes():
            blob.write_bytes(blob.read_bytes().replace(b"trainkit", b"trainkiT"))
    with pytest.raises(SpecError, match=r"its config blob sha256:\w+ did not download intact"):
        image.check_image_ref(f"{url}:v1", ecr)


def test_without_recorded_outputs_there_is_no_image_to_run(fake):
    spec = build_spec({"target": "eks", "model": "llama2-7b"})
    with pytest.raises(SpecError, match=r"no training image: run `make up PROFILE=aws` .* or pass --image"):
        image.check_image(spec)


def test_secret_from_a_file_never_printed(fake, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = {"HF_TOKEN": ""}
    first = invoke("secrets.hf-token", "--file", str(token_file), env=env)
    assert first.returncode == 0, first.stderr
    assert "created Secret trainkit-jobs/hf-token" in first.stdout
    again = invoke("secrets.hf-token", "--file", str(token_file), env=env)
    assert "replaced Secret" in again.stdout
    assert fake.secrets[("trainkit-jobs", "hf-token")] == {"token": TOKEN}
    assert TOKEN not in first.stdout + first.stderr + again.stdout + again.stderr


def test_status_without_a_job_shows_what_is_up_and_the_idle_guard(fake):
    """No job is the normal state between runs: `invoke status` says so, then what the GPU nodes cost and what the
    idle guard last did (its status ConfigMap as the guard writes it), and exits 0."""
    outputs.save_outputs({"gpu_instance_type": "p5.48xlarge", "region": "us-east-1", "idle_guard": GUARD})
    fake.configmaps[(cluster.PLATFORM_NAMESPACE, cluster.IDLE_GUARD)] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": cluster.IDLE_GUARD, "namespace": cluster.PLATFORM_NAMESPACE},
        "data": {"checked_at": "2026-05-04T10:15:02Z", "decision": "keep", "reason": "job llama-run ended 3 min ago"},
    }
    result = invoke("status", "--target", "eks")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "no trainkit job in namespace trainkit-jobs (`invoke train --target eks` submits one)",
        f"GPU nodes up: 2 x p5.48xlarge, about $110.08/h (on-demand, table of {table()['as_of']})",
        "idle guard: on (30 min window); last check 2026-05-04T10:15:02Z: keep, job llama-run ended 3 min ago",
    ]


def test_a_run_id_without_a_job_and_logs_or_stop_without_one_say_what_to_do(fake):
    result = invoke("status", "--target", "eks", "--run-id", "nope")
    assert result.returncode == 2
    assert (
        "no job for run nope in namespace trainkit-jobs: submit one with `invoke train --target eks`" in result.stderr
    )
    for command in (lambda: list(eks.logs("trainkit-jobs", None)), lambda: eks.stop("trainkit-jobs", None)):
        with pytest.raises(SpecError, match=r"^no job from trainkit in namespace trainkit-jobs: submit one with "):
            command()


def test_the_api_server_refuses_a_pod_that_would_share_the_nodes_network(fake):
    """Issue 49: whoever creates a pod in the jobs' namespace (here through the official client, as kubectl or a
    user's script with API credentials would), the platform's admission policy refuses hostNetwork with a 422."""
    from kubernetes.client.exceptions import ApiException

    from trainkit.backends.eks.kube import Kube

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sniffer"},
        "spec": {"hostNetwork": True, "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "1"]}]},
    }
    with pytest.raises(ApiException) as refused:
        Kube.connect().core.create_namespaced_pod("trainkit-jobs", pod)
    assert refused.value.status == 422 and "may not share the node's network" in refused.value.body
    assert ("trainkit-jobs", "sniffer") not in fake.pods
