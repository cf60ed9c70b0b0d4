"""The training image, built and run here: the `cpu` flavour of containers/train/Dockerfile built by
`invoke images.build` with buildah (no daemon) on a Debian base made with debootstrap, then a real 2-process
llama2-tiny job run inside it through the EKS pods' entry point (`python -m trainkit.backends.eks.pod`, the
rendered PyTorchJob's command, arguments and environment plus the operator's PET_* variables), at a real etcd,
with a host folder as /fsx. Needs root, buildah and debootstrap (`make test-services` installs them).

The base and the build run in the background from early in the session (tests/helpers/image_build.py);
buildah keeps its images under a storage.conf of their own (vfs driver, graph root in a temporary folder), so
nothing is left in the machine's container storage.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from tests.helpers.eks import container, job_for, worker
from tests.helpers.image_build import BASE, HOST_CA, IMAGE
from tests.helpers.kube_api import operator_env
from trainkit.backends.eks import cluster
from trainkit.backends.eks import fsx as fsx_volumes
from trainkit.backends.eks.image import POD_ENTRY_LABEL, check_pod_entry
from trainkit.run.mounts import STANDIN_FSTYPE_ENV, mount_here
from trainkit.services import EtcdServer


def buildah(env: dict, *args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(["buildah", *args], env=env, capture_output=True, text=True, **kwargs)
    if check:
        assert done.returncode == 0, f"buildah {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def built(training_image):
    """The build, started in the background early in the session (tests/helpers/image_build.py)."""
    env, root, result = training_image
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return env, root, result


def test_the_build_was_the_printed_command_and_names_the_tag(built):
    _env, _root, result = built
    lines = result.stdout.splitlines()
    assert f"image {IMAGE} (cpu), built with buildah" in lines and lines[-1] == f"built {IMAGE}"
    (command,) = [line for line in lines if line.startswith("  command  buildah bud --file ")]
    assert "--build-arg FLAVOR=cpu" in command and f"--build-arg CPU_BASE={BASE}" in command


def test_the_image_config_says_it_holds_the_pod_entry_point(built):
    """The label the EKS preflight reads from an --image's config (trainkit/backends/eks/image.py), as the build wrote
    it; the module it names is the one the next test runs inside."""
    env, _root, _result = built
    config = json.loads(buildah(env, "inspect", "--type", "image", IMAGE).stdout)["OCIv1"]["config"]
    check_pod_entry(IMAGE, config["Labels"])
    assert config["Labels"][POD_ENTRY_LABEL] == "trainkit.backends.eks.pod"


def test_a_two_process_job_runs_inside_through_the_pod_entry_point(built, tmp_path):
    env, _root, _result = built
    fsx = tmp_path / "fsx"
    fsx.mkdir()
    home = tmp_path / "home"  # the pod's emptyDir
    home.mkdir()
    for folder in (fsx, home):  # the jobs' user reaches them; FSx's root is theirs (eks/fsx.py layout)
        os.chown(folder, cluster.JOB_UID, cluster.JOB_UID)
    with EtcdServer(tmp_path / "etcd") as etcd:
        flags = {"model": "llama2-tiny", "nodes": "1", "nproc": "2", "rdzv": "etcd", "rdzv_endpoint": etcd.endpoint}
        flags |= {"image": IMAGE, "steps": "4", "checkpoint_interval": "2", "run_id": "in-image", "metrics_port": "0"}
        flags |= {"compile": "true"}  # inductor builds its kernels with the image's own g++ and Python headers
        job = job_for(flags)
        spec = container(job)
        variables = {item["name"]: item["value"] for item in spec["env"] if "value" in item}
        variables |= {"POD_NAME": f"{job['metadata']['name']}-worker-0", **operator_env(job, 0)}
        variables[STANDIN_FSTYPE_ENV] = mount_here(fsx).fstype  # the host folder at /fsx stands for FSx for Lustre
        # What the kubelet gives a pod: its name as hostname, resolving to the pod's address (torchrun's workers
        # reach their agent's store by hostname).
        pod = variables["POD_NAME"]
        hosts = tmp_path / "hosts"
        hosts.write_text(f"127.0.0.1 localhost\n127.0.0.1 {pod}\n")
        working = buildah(env, "from", IMAGE).stdout.strip()
        # As the kubelet runs the pod: its user; its init container first, which makes the folders that the worker
        # then mounts read-write over a read-only volume (eks/fsx.py).
        user = "{runAsUser}:{runAsGroup}".format(**worker(job)["template"]["spec"]["securityContext"])
        (init,) = worker(job)["template"]["spec"]["initContainers"]
        made = buildah(
            env, "run", "--user", user, "--volume", f"{fsx}:/fsx", working, "--", *init["command"], *init["args"]
        )
        assert made.returncode == 0, made.stderr
        volumes = {fsx_volumes.VOLUME: fsx, fsx_volumes.HOME_VOLUME: home}
        run = ["run", "--user", user, "--hostname", pod, "--no-hosts", "--volume", f"{hosts}:/etc/hosts:ro"]
        for mount in spec["volumeMounts"]:
            if mount["name"] in volumes:
                source = volumes[mount["name"]] / mount.get("subPath", "")
                run += ["--volume", f"{source}:{mount['mountPath']}" + (":ro" if mount.get("readOnly") else "")]
        run += ["--workingdir", spec["workingDir"]]
        run += [arg for name, value in variables.items() for arg in ("--env", f"{name}={value}")]
        done = buildah(env, *run, working, "--", *spec["command"], *spec["args"], check=False, timeout=600)
        buildah(env, "rm", working)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    out = fsx / "runs" / "in-image"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["world_size"] == 2, summary
    assert summary["fast_paths"]["compiled_layers"] == [0, 1, 2, 3] and summary["fast_paths"]["graphs_compiled"] >= 1
    assert (out / "checkpoints" / "step-00000004" / "COMPLETE").is_file()
    assert json.loads((out / "model" / "config.json").read_text())["model_type"] == "llama"


def test_the_ca_bundle_and_the_local_wheels_are_in_no_layer(built):
    env, root, _result = built
    working = buildah(env, "from", IMAGE).stdout.strip()
    mounted = Path(buildah(env, "mount", working).stdout.strip())
    try:
        secrets = mounted / "run" / "secrets"
        assert not secrets.exists() or not any(secrets.iterdir())  # the mount point at most, empty
        size, digest = HOST_CA.stat().st_size, hashlib.sha256(HOST_CA.read_bytes()).hexdigest()
        same_size = [p for p in mounted.rglob("*") if p.is_file() and not p.is_symlink() and p.stat().st_size == size]
        assert not [p for p in same_size if hashlib.sha256(p.read_bytes()).hexdigest() == digest]
        assert not list(mounted.rglob("torch-*.whl"))
        # ... and the torch inside is the venv's own build from those wheels (the CPU one here), not PyPI's CUDA one.
        installed = [p.name for p in (mounted / "opt" / "venv").glob("lib/python3*/site-packages/torch-*.dist-info")]
        assert installed == [f"torch-{metadata.version('torch')}.dist-info"], installed
    finally:
        buildah(env, "umount", working)
        buildah(env, "rm", working)
