"""Which filesystem a path is on, from the kernel's table of this process's mounts, and the check a node makes before
it writes its run folder on FSx: a node whose FSx for Lustre mount failed would otherwise write the run on its own
disk (checkpoints split between nodes, a retry finding none, the summary gone with the instance).

The stand-ins of the tests run nodes and pods as processes here, with a plain folder as FSx, so they say which
filesystem their folder is on in STANDIN_FSTYPE_ENV; the mount table is still read and compared.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
LUSTRE = "lustre"
STANDIN_FSTYPE_ENV = "TRAINKIT_FSX_STANDIN_FSTYPE"
"""Test-only: the one filesystem type taken in place of lustre (the tests' stand-ins give their nodes and pods a
plain folder as FSx); never set on a real node."""


class NotLustre(RuntimeError):
    """The FSx folder is not on an FSx for Lustre mount."""


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts in /proc/<pid>/mountinfo's format, in the table's order.

    Linux kernel documentation, Documentation/filesystems/proc.rst, "/proc/<pid>/mountinfo - Information about
    mounts": one line per mount,

        36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue

    mount ID, parent ID, major:minor, root, mount point (relative to the process's root), mount options, zero or more
    optional fields (`tag[:value]`) ended by a separator "-", then the filesystem type, the mount source and the
    super options. Space, tab, newline and backslash in a path are written as octal escapes (`\\040` ...), so the
    fields never hold a space.
    """
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:]:
            continue  # not a mount line
        separator = fields.index("-", 6)
        if len(fields) < separator + 3:
            continue
        mounts.append(Mount(unescape(fields[4]), unescape(fields[separator + 1]), unescape(fields[separator + 2])))
    return mounts


def unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal.group(1), 8)), field)


def covers(point: str, path: str) -> bool:
    """Whether the mount point is `path` or a folder above it (/fsx covers /fsx/runs, not /fsx2)."""
    return path == point or path.startswith(point.rstrip("/") + "/")


def mount_of(path: str, mountinfo: str) -> Mount | None:
    """The mount `path` (absolute, symbolic links resolved) is on: the longest mount point that covers it; of mounts
    stacked on one point, the last in the table (the one on top)."""
    found = None
    for mount in parse_mountinfo(mountinfo):
        if covers(mount.point, path) and (found is None or len(mount.point) >= len(found.point)):
            found = mount
    return found


def mount_here(path: str | Path) -> Mount | None:
    """The mount `path` is on in this process's mount table (OSError where the table cannot be read)."""
    return mount_of(os.path.realpath(path), MOUNTINFO.read_text())


def require_lustre(path: str | Path, remedy: str, env: dict | None = None) -> None:
    """Raise NotLustre, saying what is wrong and `remedy` (what to check), unless `path` is on FSx for Lustre (on
    STANDIN_FSTYPE_ENV's filesystem instead, where that is set)."""
    env = os.environ if env is None else env
    wanted = env.get(STANDIN_FSTYPE_ENV) or LUSTRE
    try:
        mount = mount_here(path)
    except OSError as error:
        raise NotLustre(f"cannot tell whether {path} is an FSx for Lustre mount: {error}") from error
    if mount is None or mount.fstype != wanted:
        on = f"on {mount.fstype} at {mount.point}" if mount else "on no mount in /proc/self/mountinfo"
        raise NotLustre(f"{path} is not an FSx for Lustre mount (it is {on}): {remedy}")
