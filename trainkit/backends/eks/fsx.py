"""Who may write where on the shared FSx file system, on EKS.

Every job runs as one unprivileged user (cluster.JOB_UID) and FSx squashes root (the infra stack's fsx_root_squash):
root on a GPU node, a Batch host or a SageMaker host becomes nobody there, so no pod, host or image can use root to
rewrite another run's files. The file system's root therefore has to belong to the jobs' user, which only a client
the squash spares can arrange: the platform's system nodes (their subnets are the squash's no_squash_nids). The
platform stack runs `python -m trainkit.backends.eks.fsx layout /fsx` there once, as root (its Job in
trainkit-system, terraform/stacks/platform); it gives the root folder to the jobs' user, and, the first time, every
file root owned before the squash (runs written by root pods of an older platform), so an older run resumes.

A training pod then sees the volume read-only, except its own run folder and the shared tokenised-data cache, each
mounted read-write by subPath (render.py). Those two folders must exist before the kubelet mounts them: the pod's
init container makes them, `python -m trainkit.backends.eks.fsx folders PATH...`, as the jobs' user (the kubelet
would make a missing subPath as root, which the squash refuses).
"""

from __future__ import annotations

import argparse
import os
import posixpath
import stat
import sys
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from trainkit.backends.eks import cluster

if TYPE_CHECKING:  # the platform's image runs `layout` without the training dependencies (numpy, torch)
    from training.spec import Job

MIGRATED = ".trainkit-owner"
"""Marks a file system whose root-owned files were given to the jobs' user: the walk runs once, not at every apply."""


TOKENIZED_CACHE = PurePosixPath(".cache/tokenized")
"""training/text/cache.py's CACHE_DIR, written here: the platform's image runs this module without numpy
(tests/unit/test_platform_stack.py checks the two agree)."""
FOLDERS_CONTAINER = "folders"
VOLUME = "fsx"
HOME_VOLUME = "home"
# Every container of a job's pod runs as the jobs' user, never root: Pod Security's "restricted" checks
# (k8s.io/pod-security-admission/policy/check_runAsNonRoot.go, check_runAsUser.go) that the platform's admission
# rule applies to the jobs' namespace (terraform/stacks/platform), which a user's image without a USER passes too.
POD_USER = {"runAsNonRoot": True, "runAsUser": cluster.JOB_UID, "runAsGroup": cluster.JOB_UID}
# The init container's share: every container of a Guaranteed pod asks for as much as its limit (Kubernetes' "Pod
# Quality of Service Classes": init containers count).
FOLDERS_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}}


def on_volume(path: str) -> PurePosixPath:
    """A path the pods resolve from the FSx mount (their working directory), relative to the volume's root."""
    mount = PurePosixPath(cluster.FSX_MOUNT)
    return PurePosixPath(posixpath.normpath(mount / path)).relative_to(mount)


def writable(job: Job) -> list[str]:
    """What a job's pods may write on FSx, relative to its root: the run's folder and the tokenised-data cache that
    runs on the same data share (TOKENIZED_CACHE)."""
    runs = on_volume(job.run.runs_dir)
    return [str(runs / str(job.run.run_id)), str(runs / TOKENIZED_CACHE)]


def job_mounts(job: Job) -> list[dict]:
    """The volume read-only at FSX_MOUNT, and each writable folder read-write over it by subPath, at the same place
    (containerd mounts parents first: it sorts a container's mounts by the number of parts of their paths)."""
    mounts = [{"name": VOLUME, "mountPath": cluster.FSX_MOUNT, "readOnly": True}]
    mounts += [{"name": VOLUME, "mountPath": f"{cluster.FSX_MOUNT}/{path}", "subPath": path} for path in writable(job)]
    return [*mounts, {"name": HOME_VOLUME, "mountPath": cluster.JOB_HOME}]


def folders_container(job: Job) -> dict:
    """The init container that makes the writable folders before the kubelet mounts them (trainkit's code only:
    the workload has not started)."""
    return {
        "name": FOLDERS_CONTAINER,
        "image": job.placement.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", "trainkit.backends.eks.fsx", "folders"],
        "args": [f"{cluster.FSX_MOUNT}/{path}" for path in writable(job)],
        "resources": FOLDERS_RESOURCES,
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": VOLUME, "mountPath": cluster.FSX_MOUNT}],
    }


def layout(root: Path, uid: int, gid: int) -> list[str]:
    """Give `root` (the file system's root, mode 0755) to uid:gid and, the first time, every entry root owns below
    it (symbolic links themselves, never followed); the lines say what changed."""
    done = []
    if (root.stat().st_uid, root.stat().st_gid) != (uid, gid):
        os.chown(root, uid, gid)
        done.append(f"{root}: owner set to {uid}:{gid}")
    if stat.S_IMODE(root.stat().st_mode) != 0o755:
        root.chmod(0o755)
        done.append(f"{root}: mode set to 0755")
    marker = root / MIGRATED
    if marker.exists():
        return done
    given = 0
    for folder, folders, files in os.walk(root):
        for name in folders + files:
            path = os.path.join(folder, name)
            if os.lstat(path).st_uid == 0:
                os.chown(path, uid, gid, follow_symlinks=False)
                given += 1
    marker.write_text(f"{uid}:{gid}\n")
    os.chown(marker, uid, gid)
    done.append(f"{root}: {given} root-owned entries given to {uid}:{gid}")
    return done


def make_folders(paths: list[Path]) -> None:
    """The folders a pod mounts by subPath, made by the jobs' user. A link on the way (where the kubelet would then
    mount what it points to) is refused, as is a file where a folder should be."""
    for path in paths:
        path = path.absolute()
        path.mkdir(parents=True, exist_ok=True)
        if Path(os.path.realpath(path)) != path or not path.is_dir():
            raise SystemExit(f"error: {path} is a link or a file, not a folder: move it aside so the run has its own")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = parser.add_subparsers(dest="step", required=True)
    give = steps.add_parser("layout", help="give the file system's root to the jobs' user (platform, as root)")
    give.add_argument("root", type=Path)
    give.add_argument("--owner", default="", help="UID:GID (default: the jobs' user)")
    make = steps.add_parser("folders", help="make the folders a pod mounts by subPath (a pod's init container)")
    make.add_argument("paths", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.step == "folders":
        make_folders(args.paths)
        return 0
    uid, _, gid = (args.owner or f"{cluster.JOB_UID}:{cluster.JOB_UID}").partition(":")
    for line in layout(args.root, int(uid), int(gid)) or [f"{args.root}: already {uid}:{gid}, 0755"]:
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
