"""The mount table as a node reads it (trainkit/run/mounts.py): /proc/<pid>/mountinfo's lines (the kernel's
Documentation/filesystems/proc.rst), the mount a path is on, and the refusal of an FSx folder not on Lustre."""

from __future__ import annotations

import pytest

from trainkit.run import mounts

# A node's table: the root, then FSx bind-mounted into the container (a master: propagation field), a tmpfs under it.
NODE = """\
795 712 0:148 / / rw,relatime master:318 - overlay overlay rw,lowerdir=/var/lib/docker/l/A,upperdir=/u,workdir=/w
796 795 0:151 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
812 795 0:55 / /fsx rw,relatime master:500 - lustre 172.31.0.10@tcp:/abcdefgh rw,flock,lazystatfs
813 812 0:160 / /fsx/scratch rw,relatime - tmpfs tmpfs rw,size=65536k
814 795 259:1 /data /fsx2 rw,relatime shared:7 master:2 propagate_from:3 unbindable - xfs /dev/nvme1n1 rw,noquota
"""


def test_the_kernel_docs_example_line_reads_as_its_fields():
    line = "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue"
    assert mounts.parse_mountinfo(line) == [mounts.Mount(point="/mnt2", fstype="ext3", source="/dev/root")]


def test_optional_fields_none_or_several_end_at_the_separator():
    points = {m.point: (m.fstype, m.source) for m in mounts.parse_mountinfo(NODE)}
    assert points["/proc"] == ("proc", "proc")  # no optional field
    assert points["/fsx2"] == ("xfs", "/dev/nvme1n1")  # four of them
    assert points["/fsx"] == ("lustre", "172.31.0.10@tcp:/abcdefgh")


def test_escaped_space_tab_newline_and_backslash_in_a_mount_point():
    line = r"40 35 0:50 / /mnt/my\040fsx\011a\012b\134c rw - lustre 10.0.0.1@tcp:/x rw"
    (mount,) = mounts.parse_mountinfo(line)
    assert mount.point == "/mnt/my fsx\ta\nb\\c"
    assert mounts.mount_of("/mnt/my fsx\ta\nb\\c/runs", line) == mount


def test_the_longest_mount_point_that_covers_the_path_wins():
    assert mounts.mount_of("/fsx/runs/r1", NODE).fstype == "lustre"
    assert mounts.mount_of("/fsx", NODE).fstype == "lustre"
    assert mounts.mount_of("/fsx/scratch/a", NODE).fstype == "tmpfs"
    assert mounts.mount_of("/opt/ml", NODE).point == "/"


def test_a_folder_whose_name_only_starts_like_the_mount_point_is_not_under_it():
    assert mounts.mount_of("/fsx2/runs", NODE).fstype == "xfs"
    assert mounts.mount_of("/fsxx", NODE).fstype == "overlay"  # on the root, not on /fsx


def test_of_mounts_stacked_on_one_point_the_last_is_the_one_seen():
    over = "900 812 259:2 / /fsx rw,relatime - ext4 /dev/nvme2n1 rw\n"
    assert mounts.mount_of("/fsx/runs", NODE + over).fstype == "ext4"
    assert mounts.mount_of("/fsx/runs", over + NODE).fstype == "lustre"


def test_lines_without_the_separator_are_not_mounts():
    assert mounts.parse_mountinfo("garbage\n\n1 2 3:4 / /a rw shared:1 ext4 /dev/x rw\n") == []


@pytest.fixture
def table(tmp_path, monkeypatch):
    """A mount table of the test's own in place of /proc/self/mountinfo."""
    path = tmp_path / "mountinfo"
    monkeypatch.setattr(mounts, "MOUNTINFO", path)
    return path


def test_a_folder_on_lustre_passes_and_one_on_the_root_volume_is_refused_saying_what_to_do(table):
    table.write_text(NODE)
    mounts.require_lustre("/fsx", "check X", env={})
    table.write_text(NODE.replace("master:500 - lustre", "master:500 - nfs4"))
    said = r"^/fsx is not an FSx for Lustre mount \(it is on nfs4 at /fsx\): check X$"
    with pytest.raises(mounts.NotLustre, match=said):
        mounts.require_lustre("/fsx", "check X", env={})
    table.write_text("\n".join(line for line in NODE.splitlines() if " /fsx " not in line))  # the mount failed
    with pytest.raises(mounts.NotLustre, match=r"\(it is on overlay at /\)"):
        mounts.require_lustre("/fsx", "check X", env={})


def test_the_stand_ins_filesystem_is_the_one_taken_in_place_of_lustre(table):
    table.write_text(NODE)
    mounts.require_lustre("/fsx2", "-", env={mounts.STANDIN_FSTYPE_ENV: "xfs"})
    with pytest.raises(mounts.NotLustre, match="on lustre at /fsx"):  # the table is still read and compared
        mounts.require_lustre("/fsx", "-", env={mounts.STANDIN_FSTYPE_ENV: "xfs"})


def test_an_unreadable_table_is_a_refusal_too(table):
    with pytest.raises(mounts.NotLustre, match="cannot tell whether /fsx is an FSx for Lustre mount"):
        mounts.require_lustre("/fsx", "-", env={})
