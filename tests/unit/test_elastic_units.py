"""The pieces behind elastic recovery, one at a time: store retries, stop timing, exit codes, settings."""

from __future__ import annotations

import json

import pytest
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

from tests.helpers.paths import REPO
from training.common.lifecycle import StopSignal
from trainkit.backends import job_from_flags as build_spec
from trainkit.backends.local.backend import explain_failure, job_exit_code, node_command
from trainkit.bench import chaos
from trainkit.errors import SpecError
from trainkit.run.rendezvous import PatientBackend
from trainkit.run.torchrun import RDZV_ID_ENV, RDZV_KEY_ENV, PreparedRun, private_rendezvous


class FlakyStore:
    """A rendezvous backend that is unreachable for its first `outages` calls."""

    name = "flaky"

    def __init__(self, outages: int):
        self.outages, self.calls = outages, 0

    def get_state(self):
        self.calls += 1
        if self.calls <= self.outages:
            raise RendezvousConnectionError("store down")
        return b"state", 7

    def set_state(self, state, token=None):
        return (*self.get_state(), True)


def test_patient_backend_waits_out_an_outage_and_answers():
    inner = FlakyStore(outages=3)
    backend = PatientBackend(inner, outage_timeout=30, name="trainkit-etcd")
    assert backend.get_state() == (b"state", 7) and inner.calls == 4
    assert backend.name == "trainkit-etcd"


def test_patient_backend_gives_up_after_its_timeout():
    backend = PatientBackend(FlakyStore(outages=10**6), outage_timeout=0.5)
    with pytest.raises(RendezvousConnectionError):
        backend.set_state(b"x", None)


def test_a_stop_saves_only_when_the_grace_period_allows():
    now = [100.0]
    stop = StopSignal(grace_s=30, clock=lambda: now[0])
    assert not stop.pending and stop.time_allows(1000)  # no stop asked for: nothing to fit
    stop._handle(15, None)
    now[0] += 10  # 20 s left
    assert stop.pending and stop.signum == 15
    assert stop.time_allows(12) and not stop.time_allows(14)  # 1.5 x the last save must fit


def test_job_exit_code_treats_a_finished_survivor_as_success():
    assert job_exit_code([0, -9]) == 0  # node 1 lost, node 0 finished the training
    assert job_exit_code([0, 1]) == 0  # node 1 stopped (SIGTERM) or gave up; node 0 finished
    assert job_exit_code([1, -9]) == 1
    assert job_exit_code([-9, -9]) == 137


def test_c10d_store_host_loss_is_explained_and_other_failures_are_not():
    spec = build_spec({"nodes": "1:2", "nproc": 1, "rdzv": "c10d"})
    assert "single point of failure" in explain_failure(spec, [-9, 1])
    assert explain_failure(spec, [1, -9]) is None
    etcd = build_spec({"nodes": "1:2", "nproc": 1, "rdzv": "etcd", "rdzv_endpoint": "127.0.0.1:2379"})
    assert explain_failure(etcd, [-9, 1]) is None


def _rdzv_conf(rdzv: str, node: int) -> str:
    spec = build_spec({"nodes": "1:2", "nproc": 1, "rdzv": rdzv, "rdzv_endpoint": "127.0.0.1:2379"})
    command = node_command(PreparedRun(spec, ["-m", "training"]), "127.0.0.1:1", node)
    return command[command.index("--rdzv-conf") + 1]


def test_c10d_store_is_hosted_by_node_0_only():
    assert "is_host=true" in _rdzv_conf("c10d", 0) and "is_host=false" in _rdzv_conf("c10d", 1)
    assert "is_host" not in _rdzv_conf("etcd", 0)
    assert "last_call_timeout=5" in _rdzv_conf("etcd", 1) and "keep_alive_interval=2" in _rdzv_conf("etcd", 1)


def test_a_local_node_names_its_rendezvous_in_its_environment_and_uses_the_private_c10d():
    """/proc/<pid>/cmdline is readable by every user of the machine; the agent's environment by its user only."""
    spec = build_spec({"nodes": "1:2", "nproc": 1, "rdzv": "c10d"})
    command = node_command(PreparedRun(spec, ["-m", "training"]), "127.0.0.1:1", 0)
    assert "--rdzv-id" not in command and command[command.index("--rdzv-backend") + 1] == "trainkit-c10d"
    env = private_rendezvous("run-1a2b")
    assert env[RDZV_ID_ENV] == "run-1a2b" and len(env[RDZV_KEY_ENV]) == 64  # 32 random bytes, hex
    assert private_rendezvous("run-1a2b")[RDZV_KEY_ENV] != env[RDZV_KEY_ENV]  # a key per submission


def test_chaos_rejects_unknown_names_before_running_anything():
    with pytest.raises(SpecError, match="choose from all, worker-kill"):
        chaos.select("worker-kill,bogus", "all")
    with pytest.raises(SpecError, match="--rdzv zookeeper"):
        chaos.select("all", "zookeeper")
    assert len(chaos.select("all", "all")) == len(chaos.SCENARIOS) * 2


def test_committed_benchmark_matches_the_docs_table_and_covers_every_scenario():
    record = json.loads((REPO / "benchmarks" / "elastic.json").read_text())
    assert (REPO / chaos.TABLE_FILE).read_text() == chaos.table_file(record)
    pairs = {(r["scenario"], r["backend"]) for r in record["results"]}
    assert pairs == {(s, b) for s in chaos.SCENARIOS for b in chaos.BACKENDS}
    assert all(r["ok"] for r in record["results"])


def test_a_scenario_times_out_on_silence_not_on_a_slow_machine():
    """The harness's limit: progress (a step or an event) restarts the stall window; silence or the cap ends it."""
    now = [0.0]
    limit = chaos.harness.Limit(stall_s=120, timeout_s=600, clock=lambda: now[0])
    for _ in range(4):  # a slow but healthy job: a step every 100 s, 400 s in all
        now[0] += 100
        assert limit.passed() is None
        limit.progress()
    now[0] += 121  # a hung rendezvous: nothing for longer than the window
    assert limit.passed() == "no progress (step or event) for 120 s"
    limit.progress()
    now[0] += 80  # still progressing, but past the whole cap
    assert limit.passed() == "no end within 600 s"
