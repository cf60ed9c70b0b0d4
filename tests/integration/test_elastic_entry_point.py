"""torchrun finds trainkit's rendezvous backends through the package's entry point (a fresh interpreter), and the
local target's c10d one keeps its store to this machine and its state to the job."""

from __future__ import annotations

import base64
import os
import pickle
import subprocess
import sys
import time

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousStateError

from tests.helpers.containers import free_port
from tests.helpers.paths import REPO
from tests.helpers.sockets import listening_addresses
from trainkit.run.rendezvous import create_c10d_handler
from trainkit.run.torchrun import RDZV_KEY_ENV

# How long torch's rendezvous serves its last read of the state before reading the store again (torch 2.13
# dynamic_rendezvous.py:387, _BackendRendezvousStateHolder's cache_duration: 1 s), plus a margin.
STATE_CACHE_S = 1.2


def test_torchrun_finds_the_etcd_and_c10d_backends_through_the_entry_point():
    code = "from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as r; print(r._registry)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert "trainkit-etcd" in out and "trainkit-c10d" in out


def test_the_local_c10d_store_listens_on_loopback_only_and_loads_no_state_it_did_not_sign(tmp_path, monkeypatch):
    """torch's own c10d store listens on every interface; trainkit-c10d's only on the endpoint's address. A user of
    this machine still reaches it there and finds the rendezvous key (list_keys), so the state it writes, a pickle
    that would run code when loaded, must be refused before torch unpickles it."""
    monkeypatch.setenv(RDZV_KEY_ENV, "this job's key")
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # as the local backend runs it
    port = free_port()
    conf = {"is_host": "true", "last_call_timeout": "1", "keep_alive_interval": "600"}
    handler = create_c10d_handler(RendezvousParameters("trainkit-c10d", f"127.0.0.1:{port}", "job-1", 1, 1, **conf))
    assert listening_addresses(port) == {"127.0.0.1"}
    assert handler.next_rendezvous().rank == 0  # the job's own signed state round-trips

    intruder = TCPStore("127.0.0.1", port, is_master=False)
    assert "torch.rendezvous.job-1" in intruder.list_keys()
    planted = tmp_path / "planted"
    intruder.set("torch.rendezvous.job-1", base64.b64encode(pickle.dumps(Planted(planted))))
    time.sleep(STATE_CACHE_S)
    with pytest.raises(RendezvousStateError, match="not signed with this job's key"):
        handler.num_nodes_waiting()  # reads the state back
    assert not planted.exists()


class Planted:
    """A state whose loading runs code: it makes a folder."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_the_etcd_rendezvous_loads_no_state_it_did_not_sign(tmp_path, monkeypatch):
    """etcd's v2 API lets any client that reaches it read and write every key: the local etcd (on 127.0.0.1, no
    authentication) and, on EKS, the platform's, which every pod of the jobs' namespace reaches. With the job's key
    (the local target's environment; on EKS the submission's Secret) a state another client wrote is refused before
    torch unpickles it."""
    import urllib.parse
    import urllib.request

    from trainkit.run.rendezvous import create_etcd_handler
    from trainkit.services import EtcdServer

    monkeypatch.setenv(RDZV_KEY_ENV, "this job's key")
    with EtcdServer(tmp_path / "etcd") as etcd:
        conf = {"last_call_timeout": "1", "keep_alive_interval": "600"}
        handler = create_etcd_handler(RendezvousParameters("trainkit-etcd", etcd.endpoint, "job-2", 1, 1, **conf))
        assert handler.next_rendezvous().rank == 0  # the job's own signed state round-trips
        planted = tmp_path / "planted"
        value = base64.b64encode(pickle.dumps(Planted(planted))).decode()  # as torch's backend stores a state
        request = urllib.request.Request(
            f"http://{etcd.endpoint}/v2/keys/torch/elastic/rendezvous/job-2",
            data=urllib.parse.urlencode({"value": value}).encode(),
            method="PUT",
        )
        urllib.request.urlopen(request, timeout=5).close()
        time.sleep(STATE_CACHE_S)
        with pytest.raises(RendezvousStateError, match="not signed with this job's key"):
            handler.num_nodes_waiting()
        assert not planted.exists()
