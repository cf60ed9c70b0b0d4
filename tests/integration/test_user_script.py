"""`invoke run --dry-run`, through the command line: on EKS the code's ConfigMap (valid as a core object,
strictly) and a PyTorchJob the v1.9.4 CRD and webhook admit (strictly) that runs the script from the mounted code;
locally the job and the workload; and a script run that names no script is refused before anything exists. And
the install of a script's requirements each node does, with the real pip."""

from __future__ import annotations

import json
import os
import stat
import tempfile

import pytest

from tests.helpers.crd import admission_errors
from tests.helpers.eks import IMAGE, container, dry_run_objects, validate_core, worker
from tests.helpers.paths import REPO
from tests.helpers.product import invoke
from tests.helpers.wheels import pip_hash, write_wheel
from trainkit.backends.eks import render
from trainkit.errors import SpecError
from trainkit.run.workload import WORKLOAD_ENV
from trainkit.workloads.packages import install


def test_on_eks_the_dry_run_is_the_code_configmap_and_a_job_the_operator_admits(tmp_path):
    env = {"TRAINKIT_STATE_DIR": str(tmp_path / "state"), "KUBECONFIG": str(tmp_path / "none")}
    flags = ["--target", "eks", "--nodes", "1:2", "--image", IMAGE, "--run-id", "mine", "--dry-run"]
    result = invoke("run", "--script", "examples/native_ddp.py", *flags, "--", "--epochs", "3", env=env)
    assert result.returncode == 0, result.stderr
    objects = dry_run_objects(result.stdout)  # each valid as a core object, strictly
    configmap, job = objects["ConfigMap"], objects["PyTorchJob"]
    (code,) = [v["configMap"] for v in worker(job)["template"]["spec"]["volumes"] if "configMap" in v]
    assert configmap["metadata"]["name"] == code["name"]
    assert admission_errors(job) is None, admission_errors(job)
    validate_core(job)
    mapped = {i["path"] for i in code["items"]}
    assert {"native_ddp.py", "lightning_ddp.py"} <= mapped
    assert (REPO / "examples" / "native_ddp.py").read_text() in configmap["data"].values()
    workload = json.loads(next(e["value"] for e in container(job)["env"] if e["name"] == WORKLOAD_ENV))
    assert workload["code"] == render.CODE_MOUNT and workload["args"] == ["--epochs", "3"]
    assert workload["script"].startswith("runs/mine/code/") and workload["script"].endswith("/native_ddp.py")
    assert job["spec"]["elasticPolicy"]["minReplicas"] == 1 and job["spec"]["elasticPolicy"]["maxReplicas"] == 2
    assert job["metadata"]["labels"][render.LABEL_MODEL] == "native_ddp.py"


def test_locally_the_dry_run_prints_the_job_and_the_workload_and_creates_nothing(tmp_path):
    runs = tmp_path / "runs"
    result = invoke("run", "--script", "examples/native_ddp.py", "--runs-dir", str(runs), "--dry-run")
    assert result.returncode == 0, result.stderr
    decoder = json.JSONDecoder()
    job, end = decoder.raw_decode(result.stdout)
    workload = json.loads(result.stdout[end:])["workload"]
    assert job["run"]["workload"] == "script" and workload["script"] and not runs.exists()


def test_a_run_without_a_script_is_refused():
    result = invoke("run", "--nproc", "2")
    assert result.returncode == 2 and "--script FILE is required" in result.stderr


def test_hashed_requirements_install_from_a_wheelhouse_and_a_wheel_no_hash_matches_is_refused(tmp_path, monkeypatch):
    """What each node does before torchrun starts (trainkit/workloads/packages.py), with the real pip: a requirement
    pinned by hash installs from a wheelhouse into this user's private cache; a wheel that matches none of its line's
    hashes is refused, saying which hash it has."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    wheels = tmp_path / "wheels"
    wheel = write_wheel(wheels, "tk_hashed", "1.0", "VALUE = 7\n")
    site = install((f"tk_hashed==1.0 --hash={pip_hash(wheel)}",), str(wheels))
    assert (site / "tk_hashed" / "__init__.py").read_text() == "VALUE = 7\n"
    assert site.parent.parent == tmp_path / f"trainkit-packages-{os.getuid()}"
    assert stat.S_IMODE(site.parent.parent.stat().st_mode) == 0o700
    others = "--hash=sha256:" + "0" * 64 + " --hash=sha256:" + "1" * 64
    with pytest.raises(SpecError) as refused:
        install((f"tk_hashed==1.0 {others}",), str(wheels))
    assert str(refused.value) == (
        f"--requirements: tk_hashed==1.0 from {wheels} matches no --hash of its line (its hash is {pip_hash(wheel)}); "
        "if that wheel is the one you meant, put its hash in the file (`pip hash WHEEL` prints it), else replace the "
        "wheel"
    )
