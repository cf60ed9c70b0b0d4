"""Hosts that are really apart, for the multi-node stand-ins (SageMaker's hosts, Batch's nodes, EKS's pods): each
host runs in a network namespace and a UTS namespace of its own, with its own address on a test bridge, its own
hostname and its own /etc/hosts, so 127.0.0.1 is each host's own, as in the cloud. A job that reaches a peer by
loopback, or by a name its service does not resolve, fails here as it would there.

How (iproute2's ip-netns(8): `ip netns exec NAME cmd` runs cmd in the namespace and bind-mounts
/etc/netns/NAME/hosts over /etc/hosts for it; util-linux's unshare(1) --uts gives it a hostname of its own):

    root namespace:  bridge tkn<id>br, the gateway 10.231.<n>.1/24
    each host:       netns tkn<id>-<k>, a veth pair whose inside end is eth0 at 10.231.<n>.<2 + k>/24, lo up,
                     default route via the gateway; /etc/netns/tkn<id>-<k>/hosts, and a resolv.conf naming no
                     name server

Everything is named `tkn<id>...` (a random id per network, 10.231.0.0/16 the range the tests own) and removed when
the network closes, even after a failure; a network whose test process died is swept by the next one. What runs
in the root namespace (the AWS emulator, a metadata endpoint, etcd) is reached at the gateway through `relay`.
Where namespaces cannot be made, opening a network raises with the reason: the tests need root, nothing more.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

RANGE = "10.231"
STATE = Path("/run/trainkit-netns")
PREFIX = "tkn"
LOOPBACK_URL = re.compile(r"\b(?:127\.0\.0\.1|localhost):(\d+)")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(
            f"`ip {' '.join(args)}` failed ({done.stderr.strip() or done.returncode}): the multi-node stand-ins run "
            "each host in a network namespace of its own, which needs root and iproute2"
        )
    return done


@dataclass(frozen=True)
class Host:
    netns: str
    address: str
    hostname: str

    @property
    def hosts_file(self) -> Path:
        return Path("/etc/netns") / self.netns / "hosts"


class Network:
    """One test's network: `add` hosts, `command` runs a program on one, `relay` reaches the root namespace."""

    def __init__(self) -> None:
        self.id = ""  # chosen when the network opens, among those no network holds
        self.bridge = ""
        self.hosts: dict[str, Host] = {}
        self.gateway = ""
        self._relays: dict[int, socket.socket] = {}
        self._closing = threading.Event()

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> Network:
        STATE.mkdir(parents=True, exist_ok=True)
        with (STATE / "lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            sweep()
            held = [name.split("-") for name in os.listdir(STATE) if name.startswith("net-")]
            free = [n for n in range(1, 255) if str(n) not in {subnet for _, subnet, _ in held}]
            if not free:
                raise RuntimeError(f"no free /24 left in {RANGE}.0.0/16: {STATE} lists every one as in use")
            ids = {network_id for _, _, network_id in held} | {name[3:7] for name in link_names() + netns_names()}
            self.id = next(i for i in iter(lambda: f"{random.randrange(16**4):04x}", None) if i not in ids)
            self.bridge, self.subnet = f"{PREFIX}{self.id}br", random.choice(free)
            (STATE / f"net-{self.subnet}-{self.id}").write_text(str(os.getpid()))
        self.gateway = f"{RANGE}.{self.subnet}.1"
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()
        for server in self._relays.values():
            with contextlib.suppress(OSError):
                server.close()
        if self.id:
            remove(self.id)

    # ------------------------------------------------------------ hosts

    def add(self, key: str, hostname: str | None = None) -> Host:
        """A host (again the same one for a key already added): its namespace, address and hostname (by default an
        EC2-style name of its address, as an instance's own)."""
        if key in self.hosts:
            return self.hosts[key]
        index = len(self.hosts)
        if index > 250:
            raise RuntimeError("a test network holds at most 251 hosts")
        address = f"{RANGE}.{self.subnet}.{index + 2}"
        netns, outside = f"{PREFIX}{self.id}-{index}", f"{PREFIX}{self.id}h{index}"
        host = Host(netns, address, hostname or f"ip-{address.replace('.', '-')}.ec2.internal")
        ip("netns", "add", netns)
        ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", netns)
        ip("link", "set", outside, "master", self.bridge, "up")
        ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", netns, "link", "set", "eth0", "up")
        ip("-n", netns, "link", "set", "lo", "up")
        ip("-n", netns, "route", "add", "default", "via", self.gateway)
        self.hosts[key] = host
        self.write_hosts(host, {})
        return host

    def write_hosts(self, host: Host, names: dict[str, str]) -> None:
        """The host's /etc/hosts: localhost, its own address and hostname (as a container runtime writes them),
        then `names` (name -> address: what the service resolves). Written in place, so a host already running
        sees a later version through its bind mount."""
        lines = ["127.0.0.1\tlocalhost", f"{host.address}\t{host.hostname}"]
        lines += [f"{address}\t{name}" for name, address in names.items()]
        host.hosts_file.parent.mkdir(parents=True, exist_ok=True)
        # No name server (ip netns exec mounts this over /etc/resolv.conf): a name the hosts file does not give fails
        # at once (glibc then asks 127.0.0.1, which is the host's own and refuses), as the service's DNS knows none.
        (host.hosts_file.parent / "resolv.conf").write_text("# names resolve through /etc/hosts only\n")
        descriptor = os.open(host.hosts_file, os.O_RDWR | os.O_CREAT, 0o644)  # same inode: rewritten, not replaced
        try:
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, ("\n".join(lines) + "\n").encode(), 0)
        finally:
            os.close(descriptor)

    def command(self, host: Host, argv: list[str]) -> list[str]:
        """`argv` run on `host`: in its network namespace (and its /etc/hosts), under its hostname. Each step
        execs the next, so the process started is `argv`'s own (a signal to it reaches the program)."""
        set_name = 'echo "$0" > /proc/sys/kernel/hostname && exec "$@"'
        return ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c", set_name, host.hostname, *argv]

    # ------------------------------------------------------------ the root namespace

    def relay(self, port: int, target: int | None = None) -> str:
        """gateway:port, forwarded to 127.0.0.1:target (by default the same port) in the root namespace (where the
        emulators listen)."""
        if port not in self._relays:
            server = socket.create_server((self.gateway, port))
            self._relays[port] = server
            threading.Thread(target=self._accept, args=(server, target or port), daemon=True).start()
        return f"{self.gateway}:{port}"

    def reach(self, env: dict[str, str]) -> dict[str, str]:
        """`env` with each of its values as `reached` gives it."""
        return {name: self.reached(value) for name, value in env.items()}

    def reached(self, text: str) -> str:
        """`text` with each 127.0.0.1:PORT (or localhost:PORT) in it pointed at the gateway's relay."""
        return LOOPBACK_URL.sub(lambda m: self.relay(int(m[1])), text)

    def _accept(self, server: socket.socket, port: int) -> None:
        while not self._closing.is_set():
            try:
                inside, _ = server.accept()
            except OSError:
                return
            try:
                outside = socket.create_connection(("127.0.0.1", port))
            except OSError:
                inside.close()
                continue
            for source, target in ((inside, outside), (outside, inside)):
                threading.Thread(target=pipe, args=(source, target), daemon=True).start()


def pipe(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            target.sendall(data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)


def remove(network_id: str) -> None:
    """Everything of network `network_id`: its hosts' processes, namespaces and hosts files, its bridge (which takes
    the veth pairs with it), its state file."""
    namespaces = [name for name in netns_names() if name.startswith(f"{PREFIX}{network_id}-")]
    for netns in namespaces:
        pids = ip("netns", "pids", netns, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        ip("netns", "del", netns, check=False)
        shutil.rmtree(Path("/etc/netns") / netns, ignore_errors=True)
    for link in link_names():  # the veth pairs (their inside ends go with the namespaces, once their processes end)
        if link.startswith(f"{PREFIX}{network_id}"):
            ip("link", "del", link, check=False)
    for state in STATE.glob(f"net-*-{network_id}"):
        state.unlink(missing_ok=True)


def link_names() -> list[str]:
    return [
        line.split(":")[1].strip().split("@")[0] for line in ip("-o", "link", "show", check=False).stdout.splitlines()
    ]


def netns_names() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list", check=False).stdout.splitlines() if line.strip()]


def sweep() -> None:
    """Networks whose test process is gone (a killed run): removed, so their range and names are free again."""
    for state in STATE.glob("net-*-*"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(state.read_text())
            if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
                remove(state.name.rsplit("-", 1)[1])
