"""The stand-ins' hosts are really apart (tests/helpers/netns.py): each host's loopback is its own, a peer is
reached only by its address or a name its hosts file gives, the hostname is the host's own, the root namespace's
emulators are reached through the gateway, and nothing of a network is left once it closes, even when a host's
process still runs."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.helpers.netns import PREFIX, Network, link_names, netns_names

PROBE = """
import socket, sys, urllib.request
print(socket.gethostname())
for target in sys.argv[1:]:
    try:
        urllib.request.urlopen(target, timeout=2).read()
        print("reached", target)
    except Exception as error:
        print("failed", target, type(error).__name__)
"""


def test_hosts_reach_each_other_by_address_or_given_name_only_and_the_root_through_the_gateway(tmp_path):
    (tmp_path / "index.html").write_text("root")
    root = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        port = int(root.stdout.readline().split(" port ")[1].split()[0])
        with Network() as network:
            a, b = network.add("a"), network.add("b", hostname="bee")
            network.write_hosts(a, {"algo-2": b.address})
            server = subprocess.Popen(
                network.command(b, [sys.executable, "-m", "http.server", "8000", "--bind", "0.0.0.0"]),
                cwd=tmp_path,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)
            gateway = network.reached(f"http://127.0.0.1:{port}/")
            targets = [
                "http://algo-2:8000/",
                f"http://{b.address}:8000/",
                "http://127.0.0.1:8000/",
                "http://bee:8000/",
                gateway,
            ]
            done = subprocess.run(
                network.command(a, [sys.executable, "-c", PROBE, *targets]), capture_output=True, text=True, timeout=60
            )
            lines = done.stdout.splitlines()
            assert lines[0] == a.hostname and a.hostname.startswith("ip-10-231-"), done
            assert lines[1:] == [
                "reached http://algo-2:8000/",
                f"reached http://{b.address}:8000/",
                "failed http://127.0.0.1:8000/ URLError",  # loopback is a's own: b's server is not there
                "failed http://bee:8000/ URLError",  # b's hostname is b's: a's hosts file does not name it
                f"reached {gateway}",
            ], done
            names = {network.bridge, *(h.netns for h in (a, b))}
        # b's server still ran when the network closed: it is gone, and so is everything named for the network
        assert server.wait(timeout=10) is not None
        assert not names & {*link_names(), *netns_names()}
        assert not any(name.startswith(PREFIX + network.id) for name in [*link_names(), *netns_names()])
    finally:
        root.kill()
