"""`invoke run --script`: the two example scripts, plain DDP (examples/native_ddp.py) and Lightning DDP
(examples/lightning_ddp.py), trained by 2 processes on CPU through the local backend. Each loses rank 1 to
kill -9 mid-run; torchrun restarts the workers and the script resumes from its own last checkpoint and finishes,
every step in metrics.jsonl once. The plain one is also stopped with `invoke stop` and resumed by the same command,
and followed with `invoke status` and `invoke logs --rank 1`. On EKS (the operator's stand-in), a script with a
sibling module and a hash-pinned package from a wheelhouse runs in two pods to completion."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers.eks import IMAGE
from tests.helpers.product import invoke, invoke_in, output, read_jsonl, run_folder, start_invoke
from tests.helpers.waiting import wait_for
from tests.helpers.wheels import pip_hash, write_wheel
from training.common.failure import EXIT_NO_RETRY
from training.spec import EMBEDDED_STORE
from trainkit.services import EtcdServer


def rank_pid(run_dir: Path, rank: int) -> int | None:
    """The process of a global rank of this run: torchrun's worker whose environment names the run folder."""
    wanted = {f"TRAINKIT_RUN_DIR={run_dir}".encode(), f"RANK={rank}".encode()}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            variables = set(environ.read_bytes().split(b"\0"))
        except OSError:
            continue
        if wanted <= variables:
            return int(environ.parent.name)
    return None


def reported_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    try:
        return [record["step"] for record in read_jsonl(path)]
    except (OSError, ValueError):  # not there yet, or a line being written
        return []


def run_args(runs: Path, script: str, *args: str) -> list[str]:
    return ["run", "--script", script, "--nproc", "2", "--runs-dir", str(runs), "--metrics-port", "0", "--", *args]


def kill_rank_1_after(run_dir: Path, step: int) -> None:
    wait_for(lambda: len(reported_steps(run_dir)) >= step, 180, f"step {step}")
    pid = wait_for(lambda: rank_pid(run_dir, 1), 30, "rank 1's process")
    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("script", "args", "total", "resumed"),
    [
        ("examples/native_ddp.py", ("--epochs", "2", "--step-sleep", "0.3"), 32, "resumed from step"),
        ("examples/lightning_ddp.py", ("--steps", "30", "--step-sleep", "0.3"), 30, "resuming from"),
    ],
    ids=["native", "lightning"],
)
def test_a_script_that_loses_a_rank_to_kill_9_resumes_from_its_own_checkpoint_and_finishes(
    tmp_path, script, args, total, resumed
):
    tracked = run_args(tmp_path, script, *args)
    if script.endswith("native_ddp.py"):  # its report_step reaches MLflow (issue 54)
        tracked[tracked.index("--") : tracked.index("--")] = ["--track", "mlflow"]
    process = start_invoke(*tracked)
    run_dir = wait_for(lambda: run_folder(tmp_path), 60, "run dir")
    kill_rank_1_after(run_dir, 8)  # past the first checkpoint (every 5 steps)
    assert process.wait(timeout=300) == 0, output(process)
    assert resumed in output(process)
    assert reported_steps(run_dir) == list(range(1, total + 1))  # the redone steps once each
    assert (run_dir / "code").is_dir() and (run_dir / "checkpoints").is_dir()
    if not script.endswith("native_ddp.py"):
        return
    # One MLflow run in the embedded store, as a recipe's: the steps once each, FINISHED, the code's hash as a tag.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / EMBEDDED_STORE}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED" and run.data.tags["trainkit.workload"] == "script"
    assert run.data.tags["trainkit.code_hash"] == next((run_dir / "code").iterdir()).name
    losses = {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl")}
    history = client.get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, total + 1)), [m.step for m in history]
    # Each step's first value: the killed attempt's for a step it reported after the checkpoint and the restart redid
    # (a script's redo need not repeat it); the others are metrics.jsonl's.
    (resumed,) = [e["step"] for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "resume"]
    sent = {m.step: m.value for m in history}
    assert all(sent[step] == losses[step] for step in (*range(1, resumed + 1), total)), (sent, losses, resumed)


def test_a_script_run_is_followed_stopped_and_resumed_by_the_same_command(tmp_path):
    args = run_args(tmp_path, "examples/native_ddp.py", "--epochs", "2", "--step-sleep", "0.3")
    process = start_invoke(*args)
    run_dir = wait_for(lambda: run_folder(tmp_path), 60, "run dir")
    wait_for(lambda: len(reported_steps(run_dir)) >= 7, 180, "step 7")
    running = invoke("status", "--runs-dir", str(tmp_path))
    assert f"run {run_dir.name} (script native_ddp.py, 1 node(s) x 2 process(es)): running" in running.stdout
    stopped = invoke("stop", "--runs-dir", str(tmp_path))
    assert stopped.returncode == 0, stopped.stderr
    assert process.wait(timeout=120) != 0
    assert "the same command resumes it" in output(process)
    again = invoke(*args, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = re.search(r"resumed from step (\d+)", again.stdout)
    assert resumed and 5 <= int(resumed[1]) < 32 and int(resumed[1]) % 5 == 0, again.stdout  # the last snapshot
    assert reported_steps(run_dir) == list(range(1, 33))
    finished = invoke("status", "--runs-dir", str(tmp_path))
    assert f"run {run_dir.name} (script native_ddp.py, 1 node(s) x 2 process(es)): finished" in finished.stdout
    assert "step       32, loss" in finished.stdout
    rank_1 = invoke("logs", "--runs-dir", str(tmp_path), "--rank", "1")
    assert f"rank 1: starting at step {resumed[1]} of 32" in rank_1.stdout


FAILING_SCRIPT = """
import torch
import torch.distributed as dist

from training.script import report_step

dist.init_process_group("gloo")
for step in range(1, 6):
    if dist.get_rank() == 1 and step == 3:
        raise ValueError("bad label 7 in shard 3 (expected 0..4)")
    dist.all_reduce(torch.ones(1))
    report_step(step, loss=1.0 / step)
"""

REFUSING_SCRIPT = """
import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.parse_args()
"""


def failed_script(tmp_path: Path, name: str, text: str, *flags: str) -> tuple[subprocess.CompletedProcess, str]:
    """`invoke run --script NAME` of a script that fails, typed in the script's own folder, which then also holds
    the runs folder (the default, ./runs): (what it printed, what `invoke status` says)."""
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / name).write_text(text)
    failed = invoke_in(code, "run", "--script", name, "--nproc", "2", "--metrics-port", "0", *flags)
    assert failed.returncode != 0, failed.stdout[-2000:]
    shown = invoke_in(code, "status")
    assert shown.returncode == 0, shown.stderr
    return failed, shown.stdout


def test_a_scripts_exception_on_rank_1_is_the_cause_on_the_console_and_in_status(tmp_path):
    """The script knows nothing of trainkit's failure channel: the runner it starts through records the exception.
    Rank 0, stopped by its agent mid-collective (or failing on the broken collective), is not the cause."""
    failed, shown = failed_script(tmp_path, "failing.py", FAILING_SCRIPT, "--max-restarts", "1")
    cause = "rank 1: ValueError: bad label 7 in shard 3 (expected 0..4); full log: "
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("error: run failing-") and f"failed: {cause}" in last, failed.stderr[-3000:]
    assert "attempt_1/1/stderr.log" in last  # the last attempt's log of rank 1
    assert f"  cause      {cause}" in shown, shown
    assert "  restarts   torchrun restarted the workers 1 time (2 attempts in 1 launch)" in shown
    assert "  again      mend the cause; the same command runs it again" in shown
    assert "--search-root" in shown and "run --script failing.py --nproc 2 --metrics-port 0 --max-restarts 1" in shown


def test_a_script_that_argparse_refuses_says_argparses_own_line_and_is_not_restarted(tmp_path):
    failed, shown = failed_script(tmp_path, "refusing.py", REFUSING_SCRIPT)
    said = "exited with code 2: refusing.py: error: the following arguments are required: --lr"
    assert failed.returncode == EXIT_NO_RETRY, failed.stderr[-3000:]
    assert said in failed.stderr.strip().splitlines()[-1], failed.stderr[-3000:]
    assert said in shown and "(1 attempt in 1 launch)" in shown, shown


EKS_SCRIPT = """
import torch
import torch.distributed as dist

import tk_extra
from helper import steps
from training.script import report_step

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()}: {tk_extra.GREETING}", flush=True)
for step in range(1, steps() + 1):
    total = torch.ones(1)
    dist.all_reduce(total)
    report_step(step, loss=1.0 / step, world=float(total))
dist.barrier()
dist.destroy_process_group()
"""


def test_on_eks_a_script_runs_in_two_pods_with_its_folder_and_packages_from_a_wheelhouse(fake, tmp_path):
    """`invoke run --target eks`: the script's folder travels in a ConfigMap the job owns, each pod installs the
    requirements from a wheelhouse on FSx (a package this test's environment does not have), the two pods meet at
    a real etcd, and the script's step reports reach metrics.jsonl on FSx."""
    assert importlib.util.find_spec("tk_extra") is None  # only the wheelhouse has it
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(EKS_SCRIPT)
    (code / "helper.py").write_text("def steps():\n    return 4\n")  # a sibling module travels too
    wheel = write_wheel(fake.fsx / "wheels", "tk_extra", "1.0", "GREETING = 'installed from the wheelhouse'\n")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"tk_extra==1.0 --hash={pip_hash(wheel)}\n")  # each pod checks it (pip --require-hashes)
    with EtcdServer(tmp_path / "etcd") as etcd:
        flags = ["--target", "eks", "--image", IMAGE, "--nodes", "2", "--nproc", "1", "--rdzv", "etcd"]
        flags += ["--rdzv-endpoint", fake.reach(etcd.endpoint), "--metrics-port", "0", "--run-id", "mine"]
        flags += ["--requirements", str(requirements), "--wheelhouse", "wheels", "--require-hashes"]
        submitted = invoke("run", "--script", str(code / "train.py"), *flags)
        assert submitted.returncode == 0, submitted.stderr
        job = fake.jobs[("trainkit-jobs", "mine")]
        (configmap,) = [c for c in fake.configmaps.values() if "-code-" in c["metadata"]["name"]]  # not the issuer's
        assert configmap["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        fake.wait(lambda: job["status"]["conditions"][-1]["type"] in ("Succeeded", "Failed"), 240, "the job to end")
        logs = "".join(log.read_text() for log in sorted(fake.root.glob("mine-worker-*.log")))
        assert job["status"]["conditions"][-1]["type"] == "Succeeded", logs[-3000:]
    run = fake.fsx / "runs" / "mine"
    assert [(r["step"], r["world"]) for r in read_jsonl(run / "metrics.jsonl")] == [(s, 2.0) for s in range(1, 5)]
    assert "rank 1: installed from the wheelhouse" in logs and "rank 0: installed from the wheelhouse" in logs
    assert json.loads((run / "spec.json").read_text())["run"]["workload"] == "script"
    stopped = invoke("stop", "--run-id", "mine")
    assert stopped.returncode == 0, stopped.stderr
    assert configmap not in fake.configmaps.values()  # the job's code went with it
