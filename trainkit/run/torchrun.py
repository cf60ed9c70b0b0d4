"""The torchrun command line for one node, shared by the local backend and the EKS pod entry point.

Defaults that make recovery work (docs/elastic.md): a short `last_call_timeout`, so a
shrunken job restarts quickly once the survivors have joined; a short heartbeat, so a lost node is
dropped in seconds; the `trainkit-etcd` rendezvous, which waits out an etcd restart.
"""

from __future__ import annotations

import re
import secrets
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from training.spec import Job

# Seconds the rendezvous waits for more nodes once the minimum has joined (torch's default: 30).
LAST_CALL_TIMEOUT_S = 5
# A node whose agent missed this many heartbeats, this many seconds apart, is dropped from the
# rendezvous (torch's defaults: 5 s x 3). Measured here: node-loss recovery 22 s -> see docs/elastic.md.
KEEP_ALIVE_INTERVAL_S = 2
KEEP_ALIVE_MAX_ATTEMPT = 3
# c10d: torch's rendezvous in a TCP store hosted by node 0's agent. etcd: torch's dynamic
# rendezvous on etcd's v2 API with retries across an etcd restart (trainkit/run/rendezvous.py).
RDZV_BACKENDS = {"c10d": "c10d", "etcd": "trainkit-etcd"}
# On this machine, c10d is trainkit's variant of it: a store that listens on the endpoint's address (127.0.0.1) only,
# holding a state signed with the key in RDZV_KEY_ENV (trainkit/run/rendezvous.py).
LOCAL_RDZV_BACKENDS = {**RDZV_BACKENDS, "c10d": "trainkit-c10d"}
RDZV_KEY_ENV = "TRAINKIT_RDZV_KEY"
RDZV_ID_ENV = "PET_RDZV_ID"
"""Where torchrun reads `--rdzv-id` from when the command line lacks it (torch 2.13 torch/distributed/run.py:461-467
declares it with argparse_util's `env` action, which defaults it to PET_<DEST>: argparse_util.py:45-46)."""
# Where a job's etcd rendezvous keeps its keys: torch's state key <RENDEZVOUS_PREFIX>/<rdzv id>
# (etcd_rendezvous_backend.py, create_backend) and trainkit-etcd's store folder <STORE_PREFIX>/<rdzv id>/
# (trainkit/run/rendezvous.py). The platform etcd's per-job roles grant exactly these
# (trainkit/backends/eks/etcd_tls.py).
RENDEZVOUS_PREFIX = "/torch/elastic/rendezvous"
STORE_PREFIX = "/torch/elastic/store"
# The files of an etcd client identity in its folder (a kubernetes.io/tls Secret's keys, plus the CA that signed it).
TLS_CERT, TLS_KEY, TLS_CA = "tls.crt", "tls.key", "ca.crt"
# torchrun itself, with a worker's "do not retry" exit code honoured (trainkit/run/agent.py).
AGENT = "trainkit.run.agent"
# The environment of a cluster node's torchrun (an EKS pod's, a SageMaker host's). A killed worker must not leave
# the next rendezvous round waiting on its store (docs/elastic.md). LOGLEVEL=INFO makes torchrun log each
# rendezvous round (group_rank, world size), which is how `invoke logs` finds the leader and how a reader sees a
# node leave or join.
TORCH_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYTHONUNBUFFERED": "1", "LOGLEVEL": "INFO"}
GROUP_RANK = re.compile(r"group_rank=(\d+)")
"""A node's place in the latest rendezvous round, as its agent logs it (LOGLEVEL=INFO): which node's log holds a
global rank's lines (rank // processes per node), on EKS and SageMaker alike."""


def rank_prefix(rank: int, nproc: int) -> str:
    """How torchrun prefixes a worker's lines in its node's output (`--tee 3`): by local rank."""
    return f"[default{rank % nproc}]:"


@dataclass(frozen=True)
class Placement:
    """Where a cluster node stands in its job's network, as its target's entry point finds it. `is_host`: whether
    it runs the c10d store (None: torch decides by matching the endpoint against this machine's names).
    `local_addr`: the name or address its peers reach it by, which the rendezvous hands out as MASTER_ADDR when
    this node holds group rank 0 (torch's default, socket.getfqdn(), is a name only a cluster's DNS may resolve).
    `join_timeout_s`: torch's rendezvous join timeout, where the scheduler starts nodes far apart. `etcd_tls`: the
    folder of this node's etcd client identity (TLS_CERT, TLS_KEY, TLS_CA): the etcd rendezvous speaks HTTPS with it."""

    is_host: bool | None = None
    local_addr: str | None = None
    join_timeout_s: int | None = None
    etcd_tls: str | None = None


@dataclass
class PreparedRun:
    """A run ready to start on a node: the job, what follows torchrun's options (`-m module args` or `script
    args`), the processes' environment (secrets live here, never in arguments), and whether torchrun restarts."""

    job: Job
    entry: list[str]
    env: dict[str, str] = field(default_factory=dict, repr=False)
    restarts: bool = True


def rendezvous_id(job: Job) -> str:
    """Unique per submission: a reused id can meet a closed rendezvous left by an earlier job."""
    return f"{job.run.run_id}-{uuid.uuid4().hex[:8]}"


def private_rendezvous(rdzv_id: str) -> dict[str, str]:
    """The agents' environment entries that carry a local job's rendezvous id and a fresh key for its signed state.
    An environment is readable by its own user only (proc(5): /proc/<pid>/environ needs ptrace access), a command
    line by every user of the machine."""
    return {RDZV_ID_ENV: rdzv_id, RDZV_KEY_ENV: secrets.token_hex(32)}


def rdzv_conf(
    backend: str, is_host: bool | None = None, join_timeout_s: int | None = None, etcd_tls: str | None = None
) -> str:
    """A short last call and heartbeat. `is_host` (c10d only) says whether this node hosts the store;
    None leaves it to torch, which hosts it where the endpoint's address is the node's own. `join_timeout_s`: how
    long the first round waits for every node (torch's default: 600 s). `etcd_tls` (etcd only): the identity's
    folder, as torch's etcd backend takes it (protocol, ca_cert, ssl_cert, ssl_cert_key: etcd_rendezvous_backend.py,
    create_backend)."""
    conf = [
        f"last_call_timeout={LAST_CALL_TIMEOUT_S}",
        f"keep_alive_interval={KEEP_ALIVE_INTERVAL_S}",
        f"keep_alive_max_attempt={KEEP_ALIVE_MAX_ATTEMPT}",
    ]
    if join_timeout_s is not None:
        conf.append(f"join_timeout={join_timeout_s}")
    if backend == "c10d" and is_host is not None:
        conf.append(f"is_host={'true' if is_host else 'false'}")
    if backend == "etcd" and etcd_tls:
        folder = etcd_tls.rstrip("/")
        conf += ["protocol=https", f"ca_cert={folder}/{TLS_CA}", f"ssl_cert={folder}/{TLS_CERT}"]
        conf.append(f"ssl_cert_key={folder}/{TLS_KEY}")
    return ",".join(conf)


def torchrun_command(
    run: PreparedRun,
    endpoint: str,
    rdzv_id: str | None,
    log_dir: Path,
    placement: Placement | None = None,
    tee: bool = True,
    rdzv_backend: str | None = None,
) -> list[str]:
    """`tee`: every rank's output also on the agent's console, each line prefixed `[default<local rank>]:`
    (pod logs, where `invoke logs --rank` picks a rank's lines by it); else only into the rank's files under
    `log_dir` (a local run's console follows rank 0's files instead, see backends/local/console.py). `rdzv_id`
    None: the caller puts it in the agent's environment (RDZV_ID_ENV) instead, off the command line that every user
    of the machine can read (/proc/<pid>/cmdline). `rdzv_backend`: another than the job's usual (RDZV_BACKENDS)."""
    job, p = run.job, run.job.parallelism
    nnodes = str(p.nodes) if p.min_nodes == p.nodes else f"{p.min_nodes}:{p.nodes}"
    place = placement or Placement()
    local = ["--local-addr", place.local_addr] if place.local_addr else []
    named = ["--rdzv-id", rdzv_id] if rdzv_id is not None else []
    return [
        sys.executable,
        "-m",
        AGENT,
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        str(job.parallelism.nproc),
        "--rdzv-backend",
        rdzv_backend or RDZV_BACKENDS[job.elastic.rdzv],
        "--rdzv-endpoint",
        endpoint,
        *named,
        "--rdzv-conf",
        rdzv_conf(job.elastic.rdzv, place.is_host, place.join_timeout_s, place.etcd_tls),
        *local,
        "--max-restarts",
        str(job.elastic.max_restarts if run.restarts else 0),
        "--log-dir",
        str(log_dir),
        "--tee" if tee else "--redirects",
        "3",
        *run.entry,
    ]
