"""The platform's etcd on its own volume (terraform/stacks/platform), run with the real etcd binary on a folder that
keeps the kubelet's ownership rules (tests/helpers/platform_stack.py, EtcdPod): a new ext4 root is root's, 0755;
the kubelet gives it to the pod's fsGroup, after which etcd, non-root with no capability, writes its data directory
0700; a restarted pod finds its data, and the directory stays 0700 (fsGroupChangePolicy OnRootMismatch). The
stand-in switches users with setpriv, so these tests run as root."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.platform_stack import EtcdPod, etcd_pod

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the stand-in runs each container as its own user")


@pytest.fixture
def volume_root():
    """A new file system's root: root-owned, 0755, in a folder etcd's user can reach (pytest's tmp_path is 0700)."""
    assert shutil.which("etcd"), "etcd is not installed: run `make test-services` (Debian's etcd-server)"
    root = Path(tempfile.mkdtemp(prefix="trainkit-ebs-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)
    shutil.rmtree(root.parent / f"{root.name}-tls", ignore_errors=True)


def put_and_get(pod: EtcdPod, key: str, value: str | None) -> str:
    """Through etcd's v2 API, as torch's etcd rendezvous talks to it (HTTPS, a client certificate of the pod's CA):
    set the key (unless value is None), read it."""
    url, context = pod.url(f"/v2/keys/{key}")
    if value is not None:
        body = urllib.parse.urlencode({"value": value}).encode()
        urllib.request.urlopen(urllib.request.Request(url, data=body, method="PUT"), timeout=5, context=context).close()
    with urllib.request.urlopen(url, timeout=5, context=context) as answer:
        return json.load(answer)["node"]["value"]


def test_without_its_fsgroup_etcd_cannot_write_its_volume(volume_root, tmp_path):
    spec = etcd_pod()
    del spec["securityContext"]["fsGroup"]
    pod = EtcdPod(volume_root, tmp_path / "etcd.log", spec)
    pod.mount()
    assert (volume_root.stat().st_uid, volume_root.stat().st_mode & 0o7777) == (0, 0o755)
    with pytest.raises(RuntimeError, match="etcd did not start"):
        pod.start_etcd()
    assert "permission denied" in pod.log_path.read_text()


def test_etcd_writes_its_volume_and_a_restarted_pod_finds_its_data_private(volume_root, tmp_path):
    pod = EtcdPod(volume_root, tmp_path / "etcd.log")
    pod.mount()
    try:
        pod.start_etcd()
        assert put_and_get(pod, "rendezvous", "round-1") == "round-1"
    finally:
        pod.stop()
    data = volume_root / "data"
    user = etcd_pod()["securityContext"]["runAsUser"]
    assert (data.stat().st_uid, data.stat().st_gid, data.stat().st_mode & 0o7777) == (user, user, 0o2700)

    restarted = EtcdPod(volume_root, tmp_path / "etcd-restarted.log", tls=pod.tls)
    restarted.authority = pod.authority
    restarted.mount()  # the root is the group's already: OnRootMismatch changes nothing
    try:
        restarted.start_etcd()
        assert put_and_get(restarted, "rendezvous", None) == "round-1"
    finally:
        restarted.stop()
    assert data.stat().st_mode & 0o777 == 0o700  # Always would have opened it to the group at this start

    always = etcd_pod()
    always["securityContext"]["fsGroupChangePolicy"] = "Always"
    EtcdPod(volume_root, tmp_path / "etcd-always.log", always, tls=pod.tls).mount()
    assert data.stat().st_mode & 0o777 == 0o770  # what the policy keeps away
