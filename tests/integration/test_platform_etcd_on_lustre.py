"""The platform's etcd on the FSx claim (terraform/stacks/platform), run with the real etcd binary on a folder that
keeps the file system's ownership rules (tests/helpers/platform_stack.py, EtcdPodOnLustre): the subPath the kubelet
makes belongs to root with mode 0755, and no fsGroup changes that. etcd, as its non-root user with no capability,
cannot write there; after the pod's init step (root, CAP_CHOWN only) it writes, and a restarted pod finds its data.
The stand-in switches users with setpriv, so these tests run as root."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.platform_stack import EtcdPodOnLustre, etcd_pod

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the stand-in runs each container as its own user")


@pytest.fixture
def lustre_root():
    """A new file system's root: root-owned, 0755, in a folder etcd's user can reach (pytest's tmp_path is 0700)."""
    assert shutil.which("etcd"), "etcd is not installed: run `make test-services` (Debian's etcd-server)"
    root = Path(tempfile.mkdtemp(prefix="trainkit-fsx-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)


def put_and_get(pod: EtcdPodOnLustre, key: str, value: str | None) -> str:
    """Through etcd's v2 API, as torch's etcd rendezvous talks to it (HTTPS, a client certificate of the pod's CA):
    set the key (unless value is None), read it."""
    url, context = pod.url(f"/v2/keys/{key}")
    if value is not None:
        body = urllib.parse.urlencode({"value": value}).encode()
        urllib.request.urlopen(urllib.request.Request(url, data=body, method="PUT"), timeout=5, context=context).close()
    with urllib.request.urlopen(url, timeout=5, context=context) as answer:
        return json.load(answer)["node"]["value"]


def test_without_the_init_step_etcd_cannot_write_its_folder(lustre_root, tmp_path):
    pod = EtcdPodOnLustre(lustre_root, tmp_path / "etcd.log")
    pod.mount()
    folder = lustre_root / "platform" / "etcd"
    assert (folder.stat().st_uid, folder.stat().st_mode & 0o777) == (0, 0o755)
    with pytest.raises(RuntimeError, match="etcd did not start"):
        pod.start_etcd()
    assert "permission denied" in pod.log_path.read_text()


def test_after_the_init_step_etcd_writes_and_a_restarted_pod_finds_its_data(lustre_root, tmp_path):
    pod = EtcdPodOnLustre(lustre_root, tmp_path / "etcd.log")
    pod.mount()
    pod.run_init_containers()
    try:
        pod.start_etcd()
        assert put_and_get(pod, "rendezvous", "round-1") == "round-1"
    finally:
        pod.stop()
    data = lustre_root / "platform" / "etcd" / "data"
    user = etcd_pod()["securityContext"]["runAsUser"]
    assert (data.stat().st_uid, data.stat().st_gid, data.stat().st_mode & 0o777) == (user, user, 0o700)

    restarted = EtcdPodOnLustre(lustre_root, tmp_path / "etcd-restarted.log", tls=pod.tls)
    restarted.authority = pod.authority
    restarted.mount()
    restarted.run_init_containers()  # again, on a folder that is already etcd's: still CAP_CHOWN only
    try:
        restarted.start_etcd()
        assert put_and_get(restarted, "rendezvous", None) == "round-1"
    finally:
        restarted.stop()


def test_the_init_step_needs_its_capability(lustre_root, tmp_path):
    """The stand-in grants a container only the capabilities it declares: without CHOWN the step fails."""
    pod_spec = etcd_pod()
    (init,) = pod_spec["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    init["securityContext"]["capabilities"] = {"drop": ["ALL"]}
    pod = EtcdPodOnLustre(lustre_root, tmp_path / "etcd.log", pod_spec)
    pod.mount()
    with pytest.raises(RuntimeError, match="Operation not permitted"):
        pod.run_init_containers()
