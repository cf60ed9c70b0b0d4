"""A node whose FSx folder is not on FSx for Lustre refuses to run (trainkit/run/mounts.py): the Batch node's and the
EKS pod's entry points, run as their containers run them, with a plain folder of this machine as FSx and none of the
stand-ins' TRAINKIT_FSX_STANDIN_FSTYPE, end with "cannot start" (2) and the cause, and write nothing there."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.eks import container, job_for
from tests.helpers.paths import REPO
from trainkit.backends.batch.node import RESULT_PREFIX
from trainkit.run.mounts import STANDIN_FSTYPE_ENV, mount_here
from trainkit.run.node import EXIT_CANNOT_START


def entry_point(module: str, env: dict, *args: str, cwd=REPO) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != STANDIN_FSTYPE_ENV}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env={**base, "PYTHONPATH": str(REPO), **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_batch_node_without_lustre_at_its_fsx_folder_refuses_with_the_cause(tmp_path):
    fsx = tmp_path / "fsx"
    fsx.mkdir()
    here = mount_here(fsx)
    batch = {
        "AWS_BATCH_JOB_NODE_INDEX": "1",
        "AWS_BATCH_JOB_NUM_NODES": "2",
        "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
        "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.1.17",
        "AWS_BATCH_JOB_ID": "5b1f0c52#1",
        "TRAINKIT_BATCH_FSX_ROOT": str(fsx),  # where the node looks for FSx, as the Batch stand-in tells it
    }
    done = entry_point("trainkit.backends.batch.node", batch)
    assert done.returncode == EXIT_CANNOT_START, done.stdout + done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"{RESULT_PREFIX}node-1 exit 2 (cannot start): {fsx} is not an FSx for Lustre mount "
        f"(it is on {here.fstype} at {here.point}): the instance's FSx mount failed at boot"
    ), line
    assert list(fsx.iterdir()) == []


def test_an_eks_pod_whose_working_directory_is_not_on_lustre_ends_cannot_start_in_its_termination_message(tmp_path):
    fsx, termination = tmp_path / "fsx", tmp_path / "termination-log"
    fsx.mkdir()
    termination.touch()  # the kubelet's file at terminationMessagePath
    here = mount_here(fsx)
    spec = container(job_for({"model": "llama2-tiny", "nodes": "1", "nproc": "1", "run_id": "r1"}))
    env = {item["name"]: item["value"] for item in spec["env"] if "value" in item}
    env |= {"POD_NAME": "r1-worker-0", "TRAINKIT_TERMINATION_LOG": str(termination)}
    done = entry_point(spec["command"][-1], env, *spec["args"], cwd=fsx)
    assert done.returncode == EXIT_CANNOT_START, done.stdout + done.stderr
    said = termination.read_text()
    assert said.startswith(
        f"r1-worker-0: run r1 cannot start: {fsx} is not an FSx for Lustre mount (it is on {here.fstype} at "
        f"{here.point}): the claim fsx-shared mounted there"
    ), said
    assert f"error: {said}" in done.stderr
    assert list(fsx.iterdir()) == []
