"""A run that dies says why, in one line, on the console and in `invoke status`, without restarts that cannot help,
and keeps what it had: real jobs whose runs volume really fills (a tmpfs the test mounts; CI runs as root), and
whose data really cannot be read.

The volume fills after the first checkpoint, as when another writer on a shared FSx takes the space: the ranks'
own log files live on it and cannot take the error either, so the cause travels to the launcher over its
failure channel (training/common/failure.py), and the launcher keeps it in the state dir.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from tests.helpers.product import invoke, output, read_jsonl, start_invoke, tiny_args
from tests.helpers.volumes import small_volume
from tests.helpers.waiting import wait_for
from training.common.failure import EXIT_NO_RETRY
from training.vision.synthetic import SyntheticTree, write_tree
from trainkit.services import EtcdServer


def fill(volume: Path) -> Path:
    """Take every free byte of `volume`, as another writer would."""
    filler = volume / "other-writer"
    with filler.open("wb") as handle:
        with contextlib.suppress(OSError):
            while True:
                handle.write(b"\0" * 2**20)
                handle.flush()
    assert shutil.disk_usage(volume).free < 2**20
    return filler


def checkpointed(run_dir: Path) -> bool:
    events = run_dir / "events.jsonl"
    return events.exists() and any(e["event"] == "checkpoint" for e in read_jsonl(events))


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def test_a_run_whose_volume_fills_says_why_keeps_its_checkpoint_and_resumes(tmp_path, monkeypatch):
    """Before the rerun the test leaves in the run folder what a write the full volume cut short leaves: half a
    metrics record at the end of metrics.jsonl, and a corrupt line in the middle of events.jsonl (an older version
    appended after its torn line). It writes them itself because where the volume cuts this run's writes depends on
    page boundaries and on how far the run got: a run may end with no torn line at all (issue 45's run did not).
    tests/integration/test_jsonl_full_volume.py proves on a real full volume that the appender leaves none."""
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))  # the launcher's spare copy of the cause
    with small_volume(tmp_path / "volume", "160m") as volume:
        args = tiny_args(volume / "runs", "--run-id", "full", "--steps", "8", "--checkpoint-interval", "4")
        process = start_invoke(*args)
        run_dir = volume / "runs" / "full"
        wait_for(lambda: checkpointed(run_dir), 300, "the checkpoint at step 4")
        filler = fill(volume)
        assert process.wait(timeout=300) == EXIT_NO_RETRY
        console = output(process)
        cause = last_line(console)
        assert cause.startswith("error: run full failed: rank ") and "stderr.log" in cause, console[-3000:]
        assert "OSError: [Errno 28] No space left on device while writing checkpoint step-00000008" in cause
        assert cause.endswith("(not restarted: a restart would fail the same way)")
        assert "Traceback" not in console.split("torchrun:")[-1]  # no ChildFailedError wall after the agent's lines
        # Not restarted: one attempt of each rank, one start of the run.
        assert {p.name for p in (run_dir / "logs").glob("*/attempt_*")} == {"attempt_0"}
        events = [e["event"] for e in read_jsonl(run_dir / "events.jsonl")]
        assert events == ["launch", "attempt", "start", "checkpoint"]  # one launch, one attempt of torchrun
        # The last good checkpoint is kept and nothing half-written takes space.
        checkpoints = run_dir / "checkpoints"
        assert (checkpoints / "latest").read_text().strip() == "step-00000004"
        assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step-00000004"]
        status = invoke(
            "status", "--runs-dir", str(volume / "runs"), env={"TRAINKIT_STATE_DIR": str(tmp_path / "state")}
        )
        assert status.returncode == 0 and status.stdout.splitlines()[0].endswith(": failed"), status.stdout
        assert "  cause      rank " in status.stdout and "while writing checkpoint step-00000008" in status.stdout

        filler.unlink()  # the other writer is gone
        metrics, events_file = run_dir / "metrics.jsonl", run_dir / "events.jsonl"
        whole = metrics.read_text()
        last = whole.splitlines()[-1]
        metrics.write_text(whole + last[: len(last) // 2])  # the next step's line, cut short
        first, *rest = events_file.read_text().splitlines(keepends=True)
        events_file.write_text(first + rest[0][:20] + "\n" + "".join(rest))  # line 2: a torn one, in the middle
        again = invoke(*args)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        said = again.stdout + again.stderr
        assert f"note: {events_file}:2: skipped a line that is not a JSON object" in said, said[-3000:]
        assert said.count("dropped its torn last line") == 1 and f"note: {metrics}: dropped" in said, said[-3000:]
        assert [r["step"] for r in read_jsonl(metrics)] == list(range(1, 9)) and metrics.read_text().endswith("\n")
        events = read_jsonl(run_dir / "events.jsonl")
        assert [(e["event"], e.get("step")) for e in events if e["event"] in ("start", "resume")] == [
            ("start", 0),
            ("resume", 4),
        ]
        assert json.loads((run_dir / "summary.json").read_text())["steps"] == 8
        after = invoke(
            "status", "--runs-dir", str(volume / "runs"), env={"TRAINKIT_STATE_DIR": str(tmp_path / "state")}
        )
        assert after.stdout.splitlines()[0].endswith(": finished") and "cause" not in after.stdout


def test_an_image_that_does_not_decode_ends_both_nodes_at_once_and_says_which(tmp_path):
    """Two nodes on a real etcd, a loader worker each. The rank that reads the image ends with exit 3 and its agent
    restarts nobody; the other node's rank loses its peer, and its agent, whose restart would wait at the
    rendezvous for the node that left, is stopped by the launcher (without that the run would hang)."""
    tree = write_tree(tmp_path / "images", SyntheticTree(classes=2, per_class=4, val_per_class=1, size=36))
    broken = sorted((tree / "train").rglob("*.JPEG"))[3]
    good = broken.read_bytes()
    broken.write_bytes(b"this is not a JPEG")
    runs = tmp_path / "runs"
    with EtcdServer(tmp_path / "etcd") as etcd:
        args = ["train", "--model", "resnet-tiny", "--data", str(tree), "--runs-dir", str(runs), "--run-id", "bad"]
        args += ["--metrics-port", "0", "--nodes", "2", "--nproc", "1", "--rdzv", "etcd", "--rdzv-endpoint"]
        args += [etcd.endpoint, "--epochs", "1", "--global-batch-size", "4", "--loader-workers", "1"]
        failed = invoke(*args, "--max-restarts", "2", timeout=300)
        assert failed.returncode == EXIT_NO_RETRY, failed.stdout[-3000:] + failed.stderr[-3000:]
        cause = last_line(failed.stderr)
        assert cause.startswith("error: run bad failed: rank "), cause
        assert f": DataError: image {broken} does not decode" in cause and "; replace or remove it" in cause
        assert cause.endswith("(not restarted: a restart would fail the same way)")
        run_dir = runs / "bad"
        assert {p.name for p in (run_dir / "logs").glob("node-*/*/attempt_*")} == {"attempt_0"}  # 2 allowed, 0 spent
        status = invoke("status", "--runs-dir", str(runs))
        assert f": DataError: image {broken} does not decode" in status.stdout.split("  cause      ")[1]

        broken.write_bytes(good)
        again = invoke(*args, timeout=300)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2


def test_on_the_emulated_operator_a_full_volume_fails_the_job_and_status_says_why(fake, tmp_path):
    """The same fault on the EKS target: the pod entry point gets the cause over its channel, exits with the code
    that training-operator v1.9.4's ExitCode policy treats as permanent, and writes its termination message,
    which `invoke status` reads from the API (tests/helpers/kube_api.py)."""
    with small_volume(fake.fsx / "runs", "160m") as volume, EtcdServer(tmp_path / "etcd") as etcd:
        flags = ["--target", "eks", "--model", "llama2-tiny", "--image", "registry.example.com/trainkit/train:test"]
        flags += ["--nodes", "1", "--nproc", "1", "--rdzv", "etcd", "--rdzv-endpoint", fake.reach(etcd.endpoint)]
        flags += ["--metrics-port", "0", "--steps", "8", "--checkpoint-interval", "4", "--run-id", "fsx-full"]
        submitted = invoke("train", *flags)
        assert submitted.returncode == 0, submitted.stderr
        run_dir = volume / "fsx-full"
        wait_for(lambda: checkpointed(run_dir), 300, "the checkpoint at step 4")
        fill(volume)
        job = fake.jobs[("trainkit-jobs", "fsx-full")]
        fake.wait(lambda: job["status"]["conditions"][-1]["type"] == "Failed", 240, "the job to fail")
        assert (
            job["status"]["conditions"][-1]["message"]
            == 'job "fsx-full" is failing because "Worker" replica(s) failed.'
        )
        pod = fake.pod("fsx-full-worker-0")
        assert pod.terminated["exitCode"] == EXIT_NO_RETRY and pod.restarts == 0 and not fake.deleted
        status = invoke("status", "--run-id", "fsx-full")
        assert status.stdout.startswith("job trainkit-jobs/fsx-full (run fsx-full): failed (Failed)"), status.stdout
        cause = next(line for line in status.stdout.splitlines() if line.startswith("  cause "))
        assert "fsx-full-worker-0: rank 0: OSError: [Errno 28] No space left on device" in cause
        assert "while writing checkpoint step-00000008" in cause
        assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step-00000004"
