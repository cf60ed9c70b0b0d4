"""Who may write where on FSx (trainkit/backends/eks/fsx.py), with the kernel's own rules rather than ours.

The platform's layout Job runs as rendered: root holding only the capabilities the manifest gives it (setpriv's
bounding set, as runc applies the container's), on a folder standing for the file system. A job's pod then runs
as rendered: its containers' volumeMounts made as the kubelet and containerd make them (a private mount namespace;
the volume, or its subPath, bind-mounted, parents first, read-only where the mount says so), their processes as the
pod's user with no capability. A write that the mounts forbid fails with the kernel's EROFS, not with a check of ours.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers.eks import job_for, worker
from tests.helpers.platform_stack import as_container_user, manifests
from trainkit.backends.eks import cluster, fsx

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces and setpriv need root")


def layout_pod() -> tuple[dict, dict]:
    """The platform's layout Job's pod spec and its one container."""
    (job,) = [o for _, o in manifests() if o["kind"] == "Job" and o["metadata"]["name"] == cluster.FSX_LAYOUT]
    assert job["metadata"]["namespace"] == cluster.PLATFORM_NAMESPACE  # not the jobs' admission rule's namespace
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def here(args: list[str], root: Path) -> list[str]:
    """The container's paths (under FSX_MOUNT and the home folder) as this machine's, under `root`."""
    prefixes = (cluster.FSX_MOUNT, cluster.JOB_HOME)
    return [f"{root}{arg}" if arg.startswith(prefixes) else arg for arg in args]


def in_pod(pod: dict, container: dict, root: Path, volumes: dict[str, Path], argv: list[str]):
    """Run `argv` as `container` of `pod` would run: its mounts of `volumes` under `root`, its user, no capability."""
    script = ["set -e"]
    # containerd mounts a container's mounts by the number of parts of their paths (parents first)
    mounts = [mount for mount in container["volumeMounts"] if mount["name"] in volumes]
    for mount in sorted(mounts, key=lambda m: len(Path(m["mountPath"]).parts)):
        source = volumes[mount["name"]] / mount.get("subPath", "")
        target = f"{root}{mount['mountPath']}"
        script.append(f"[ -d {target} ] || mkdir -p {target}")
        script.append(f"mount --bind {source} {target}")
        if mount.get("readOnly"):
            script.append(f"mount -o remount,bind,ro {target}")
    script.append("exec " + shlex.join(as_container_user(pod, container) + argv))
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=root)


PROBE = """
import errno, sys
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("x")
        print(path.split("/fsx/", 1)[-1], "written")
    except OSError as error:
        print(path.split("/fsx/", 1)[-1], errno.errorcode[error.errno])
"""


@pytest.fixture
def space():
    """A folder the jobs' user can reach (pytest's tmp_path is 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="trainkit-fsx-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_a_jobs_pod_writes_its_own_run_and_the_cache_and_nothing_else_on_the_volume(space):
    volume = space / "volume"  # the file system, as the system node mounts it
    (volume / "runs" / "older").mkdir(parents=True)  # a run that root pods of an older platform wrote
    (volume / "runs" / "older" / "model.safetensors").write_bytes(b"weights")
    (volume / "data").mkdir()
    volume.chmod(0o700)  # the layout sets the root's mode too

    # The platform's layout step, as rendered: root with only its manifest's capabilities; its /fsx is the volume.
    layout, container = layout_pod()
    args = [str(volume) if arg == cluster.FSX_MOUNT else arg for arg in container["command"][1:]]
    command = as_container_user(layout, container) + [sys.executable, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "4 root-owned entries given to 1000:1000" in done.stdout, done.stdout
    owners = {path.relative_to(volume).as_posix(): path.stat().st_uid for path in [volume, *volume.rglob("*")]}
    assert set(owners.values()) == {cluster.JOB_UID}, owners
    assert volume.stat().st_mode & 0o777 == 0o755
    again = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "already" in again.stdout, again.stdout  # once: no second walk

    # Another run's checkpoint, written by its own pods.
    victim = volume / "runs" / "victim"
    victim.mkdir()
    (victim / "checkpoint.pt").write_bytes(b"weights")
    os.chown(victim, cluster.JOB_UID, cluster.JOB_UID)
    os.chown(victim / "checkpoint.pt", cluster.JOB_UID, cluster.JOB_UID)

    template = worker(job_for({"model": "llama2-7b", "run_id": "mine", "runs_dir": "/fsx/runs"}))["template"]
    pod = template["spec"]
    home = space / "home"
    home.mkdir()
    os.chown(home, cluster.JOB_UID, cluster.JOB_UID)  # an emptyDir belongs to the pod's fsGroup/user
    volumes = {fsx.VOLUME: volume, fsx.HOME_VOLUME: home}
    root = space / "container"
    root.mkdir()

    (init,) = pod["initContainers"]
    made = in_pod(pod, init, root, volumes, [sys.executable, "-m", *init["command"][2:], *here(init["args"], root)])
    assert made.returncode == 0, made.stderr
    assert (volume / "runs" / "mine").is_dir() and (volume / "runs" / ".cache" / "tokenized").is_dir()

    main = pod["containers"][0]
    targets = [
        "/fsx/runs/mine/spec.json",
        "/fsx/runs/.cache/tokenized/meta.json",
        "/fsx/runs/victim/checkpoint.pt",
        "/fsx/runs/new-run",
        "/fsx/data/planted",
        "/fsx/planted",
        f"{cluster.JOB_HOME}/.netrc",
    ]
    probed = in_pod(pod, main, root, volumes, [sys.executable, "-c", PROBE, *here(targets, root)])
    assert probed.returncode == 0, probed.stderr
    result = dict(line.rsplit(" ", 1) for line in probed.stdout.splitlines())
    assert result == {
        "runs/mine/spec.json": "written",
        "runs/.cache/tokenized/meta.json": "written",
        "runs/victim/checkpoint.pt": "EROFS",
        "runs/new-run": "EROFS",
        "data/planted": "EROFS",
        "planted": "EROFS",
        str(root / cluster.JOB_HOME.lstrip("/") / ".netrc"): "written",
    }, probed.stdout
    assert (victim / "checkpoint.pt").read_bytes() == b"weights"
    assert (volume / "runs" / "mine" / "spec.json").stat().st_uid == cluster.JOB_UID  # the jobs' user, not root


def test_the_folders_step_refuses_a_link_where_the_run_folder_should_be(tmp_path):
    """A link planted where a run's folder goes would have the kubelet mount what it points to (another run)."""
    (tmp_path / "runs" / "victim").mkdir(parents=True)
    (tmp_path / "runs" / "mine").symlink_to(tmp_path / "runs" / "victim")
    with pytest.raises(SystemExit, match="is a link or a file"):
        fsx.make_folders([tmp_path / "runs" / "mine"])
    (tmp_path / "runs" / "cache").write_text("")
    with pytest.raises(FileExistsError):
        fsx.make_folders([tmp_path / "runs" / "cache"])
