"""Who can reach what on this machine, as the kernel says: listening sockets from its TCP tables, and what any user
can read of another user's process (proc(5): /proc/net/tcp and tcp6; /proc/<pid>/cmdline is world-readable)."""

from __future__ import annotations

import contextlib
import socket
import sys
from pathlib import Path

TCP_LISTEN = "0A"  # the `st` column of /proc/net/tcp: the kernel's TCP_LISTEN (10)


def listening_addresses(port: int) -> set[str]:
    """The local addresses a socket listens on at `port` (IPv4 and IPv6): `{"127.0.0.1"}` for loopback only,
    `{"::"}` or `{"0.0.0.0"}` for every interface."""
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path("/proc/net") / table
        if not path.exists():
            continue
        for row in path.read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            address, hex_port = local.split(":")
            if state != TCP_LISTEN or int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(address)  # the kernel prints each 32-bit word in host byte order
            words = [raw[i : i + 4] for i in range(0, len(raw), 4)]
            packed = b"".join(word[::-1] if sys.byteorder == "little" else word for word in words)
            found.add(socket.inet_ntop(family, packed))
    return found


def command_lines_with(text: str) -> list[int]:
    """The live processes whose command line (readable by every user of the machine) contains `text`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
    return found
