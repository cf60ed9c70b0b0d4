"""Entry point of every node of a Batch multi-node parallel job: find this node's place and the main node, run the
workload through torchrun (trainkit/run/node.py, as an EKS pod and a SageMaker host do) in the run folder on FSx,
and end with an exit code the job's retry strategy decides on (trainkit/backends/batch/request.py).

What Batch gives each node's container (AWS Batch User Guide, "Environment variables" of MNP jobs and "AWS Batch job
environment variables"): AWS_BATCH_JOB_NODE_INDEX (0 ..), AWS_BATCH_JOB_NUM_NODES, AWS_BATCH_JOB_MAIN_NODE_INDEX,
AWS_BATCH_JOB_ID and AWS_BATCH_JOB_ATTEMPT (1, 2 ...), and on the child nodes only
AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS: "this variable isn't present on the main node". So the main node
finds its own address: MNP containers run in the awsvpc network mode, each with its own network interface and
private IP ("Compute environment considerations for MNP"), which the ECS agent gives the container in its task
metadata (Amazon ECS Developer Guide, "Task metadata endpoint version 4": ECS_CONTAINER_METADATA_URI_V4, the
container's Networks[].IPv4Addresses); without that endpoint, the address of the interface that routes out.

The nodes meet in a c10d store on the main node (RDZV_PORT). The rendezvous id is the job id and the attempt, so a
retried attempt, which starts every node afresh, never meets the last attempt's closed rendezvous. torchrun restarts
nobody inside an attempt: Batch replaces no node of an MNP job (a child that dies leaves the others running, "Job
lifecycle for MNP jobs"), so a failure ends the attempt and the job's retry strategy decides:

    0                  the run finished
    2                  the job cannot start (its preparation refused it): EXIT
    EXIT_NO_RETRY (3)  a failure every attempt would repeat: EXIT
    EXIT_REPLACE (192) anything a new attempt may mend (a worker failed, a peer was lost, the rendezvous failed):
                       RETRY, from the checkpoint on FSx
    128 + signal       the node was stopped (TerminateJob, the timeout): Batch retries neither

Only the main node's exit decides the job ("the final job status is determined by the main node",
"Multi-node parallel jobs"), so the main node, whose workers fail with a lost peer's collective when a child fails,
waits a moment for the children's results in the run folder (`batch/<rendezvous id>/node-<i>.json`) and takes a
child's permanent code as its own: a child's bad data must not be retried attempt after attempt.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

from training.common.failure import EXIT_NO_RETRY, NODE_ENV
from training.common.files import publish_text
from training.spec import Job
from trainkit.backends.batch.request import CODE_ENV, FSX_MOUNT_ENV, SPEC_ENV, attempts, unpack_code
from trainkit.run.agent import SCHEDULER_RESTARTS_ENV
from trainkit.run.mounts import NotLustre, require_lustre
from trainkit.run.node import EXIT_CANNOT_START, EXIT_REPLACE, run_node
from trainkit.run.torchrun import Placement
from trainkit.run.workload import WORKLOAD_ENV, Workload

RDZV_PORT = 29400
FSX_ROOT_ENV = "TRAINKIT_BATCH_FSX_ROOT"
"""Where the FSx volume is when not at its mount path (the tests' stand-in gives all nodes one shared folder)."""
JOIN_TIMEOUT_S = 1800
"""How long the rendezvous waits for every node (torch's default: 600 s; torchrun restarts nobody here, so there is
one round per attempt). Batch launches the children only once the main node's container runs ("Job lifecycle for MNP
jobs"), and each then pulls the training image (several GB) on an instance the compute environment may first have to
launch: 10 minutes can pass before the last child joins, and a timed-out rendezvous closes for good (the attempt
fails)."""
METADATA_ENV = "ECS_CONTAINER_METADATA_URI_V4"
PERMANENT = (EXIT_CANNOT_START, EXIT_NO_RETRY)
RESULTS_DIR = "batch"
PEER_WAIT_S = 5.0
RESULT_PREFIX = "trainkit node result: "
"""Each node's last line when it fails (`invoke status` shows the main node's)."""


@dataclass(frozen=True)
class Place:
    """This node's place in the job, from the variables Batch sets."""

    index: int
    count: int
    main: int
    main_address: str | None
    job_id: str
    attempt: int

    @property
    def is_main(self) -> bool:
        return self.index == self.main

    @property
    def name(self) -> str:
        return f"node-{self.index}"

    @property
    def rendezvous_id(self) -> str:
        """The same on every node of an attempt, new for each attempt (a node's job id may carry `#<index>`)."""
        return f"{self.job_id.partition('#')[0]}-{self.attempt}"


def place(env: dict) -> Place:
    def number(name: str) -> int:
        value = env.get(name)
        if value is None or not value.isdigit():
            raise ValueError(f"{name} is {value!r}: not started as a node of a Batch multi-node parallel job")
        return int(value)

    found = Place(
        index=number("AWS_BATCH_JOB_NODE_INDEX"),
        count=number("AWS_BATCH_JOB_NUM_NODES"),
        main=number("AWS_BATCH_JOB_MAIN_NODE_INDEX"),
        main_address=env.get("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"),
        job_id=env.get("AWS_BATCH_JOB_ID", "job"),
        attempt=number("AWS_BATCH_JOB_ATTEMPT") if "AWS_BATCH_JOB_ATTEMPT" in env else 1,
    )
    if not 0 <= found.index < found.count or not 0 <= found.main < found.count:
        raise ValueError(f"node {found.index} (main {found.main}) is outside a job of {found.count} nodes")
    if not found.is_main and not found.main_address:
        raise ValueError(f"child node {found.index} has no AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS")
    return found


def own_address(env: dict, fetch=urllib.request.urlopen) -> str:
    """The main node's private IPv4 address: the ECS task metadata's, else the interface that routes out."""
    uri = env.get(METADATA_ENV)
    if uri:
        with fetch(uri, timeout=5) as answer:
            networks = json.loads(answer.read()).get("Networks") or []
        for network in networks:
            if network.get("IPv4Addresses"):
                return network["IPv4Addresses"][0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the route's source address
        return sock.getsockname()[0]


def rendezvous(found: Place, env: dict, fetch=urllib.request.urlopen) -> tuple[str, Placement]:
    """host:port of the rendezvous store on the main node, and this node's placement: the main node runs the store
    (it is the node whose address the endpoint names, but its own names need not say so), and every node is
    reached at its awsvpc address, which becomes MASTER_ADDR when it holds group rank 0 (torch's default, the
    container's fqdn, resolves across the VPC only where its DNS hostnames do: not documented for MNP)."""
    own = own_address(env, fetch)
    main = own if found.is_main else found.main_address
    return f"{main}:{RDZV_PORT}", Placement(is_host=found.is_main, local_addr=own, join_timeout_s=JOIN_TIMEOUT_S)


def batch_code(code: int) -> int:
    """The node's exit code for the retry strategy: torchrun's 1 (a worker failed and it restarts nobody here) is a
    failure a new attempt may mend (run_node's permanent ones are 2 and 3 already)."""
    return EXIT_REPLACE if code == 1 else code


def results_dir(run_dir: Path, rdzv_id: str) -> Path:
    return run_dir / RESULTS_DIR / rdzv_id


def record_result(run_dir: Path, rdzv_id: str, found: Place, code: int, line: str | None) -> None:
    try:
        publish_text(results_dir(run_dir, rdzv_id) / f"{found.name}.json", json.dumps({"code": code, "line": line}))
    except OSError:  # a full volume: the main node then decides on its own
        pass


def peer_verdict(run_dir: Path, rdzv_id: str, found: Place, wait_s: float = PEER_WAIT_S) -> dict | None:
    """A child's permanent result of this attempt ({"code", "line", "node"}), waiting up to `wait_s` for children
    that have not reported (a child whose instance is gone never will)."""
    folder, deadline = results_dir(run_dir, rdzv_id), time.monotonic() + wait_s
    children = [i for i in range(found.count) if i != found.index]
    while True:
        reported = {}
        for index in children:
            try:
                reported[index] = json.loads((folder / f"node-{index}.json").read_text())
            except (OSError, ValueError):
                continue
        permanent = [(i, r) for i, r in sorted(reported.items()) if r.get("code") in PERMANENT]
        if permanent:
            index, result = permanent[0]
            return {**result, "node": f"node-{index}"}
        if len(reported) == len(children) or time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


MEANING = {EXIT_CANNOT_START: "cannot start", EXIT_NO_RETRY: "not retried", EXIT_REPLACE: "a new attempt may mend it"}


def meaning(code: int, attempts_left: int) -> str:
    """What the node's exit code means to the job, in its result line: a retryable end in the last attempt is the
    job's end."""
    if code == EXIT_REPLACE and attempts_left <= 0:
        return "no attempt left: the job ends"
    return MEANING.get(code, "stopped")


def run(found: Place, env: dict) -> int:
    fsx = env.get(FSX_ROOT_ENV) or env.get(FSX_MOUNT_ENV, "/fsx")
    remedy = (
        "the instance's FSx mount failed at boot (its /var/log/cloud-init-output.log says why): terminate the "
        "instance, so that the compute environment starts another, and submit again"
    )
    try:  # an instance whose user data failed to mount FSx still runs jobs (terraform/modules/batch)
        require_lustre(fsx, remedy, env)
    except NotLustre as error:  # no run folder to record the result in: the log's line is the cause
        print(f"{RESULT_PREFIX}{found.name} exit {EXIT_CANNOT_START} (cannot start): {error}", file=sys.stderr)
        return EXIT_CANNOT_START
    os.chdir(fsx)  # runs/<run-id> is on FSx, as on EKS
    job = Job.from_dict(json.loads(env[SPEC_ENV]))
    submitted = Workload.from_json(env[WORKLOAD_ENV])
    workload = replace(submitted, restarts=False)
    # torchrun restarts nobody here; the retry strategy's attempts left restart the job (the watchdog says which)
    attempts_left = max(0, attempts(job, submitted) - found.attempt)
    os.environ[SCHEDULER_RESTARTS_ENV] = str(attempts_left)
    if CODE_ENV in env:  # a script's folder, here on the node until prepare copies it into the run folder
        folder = unpack_code(env[CODE_ENV], Path(tempfile.mkdtemp(prefix="trainkit-code-")))
        workload = replace(workload, code=str(folder))
    os.environ[NODE_ENV] = found.name
    lines: list[str] = []
    endpoint, placement = rendezvous(found, env)
    code = batch_code(run_node(job, workload, endpoint, found.rendezvous_id, found.name, lines.append, placement))
    line = lines[-1] if lines else None
    if found.is_main and code == EXIT_REPLACE:  # not after a stop: Batch ended the job, there is nothing to decide
        verdict = peer_verdict(job.run_dir, found.rendezvous_id, found)
        if verdict is not None:
            code, line = verdict["code"], f"{verdict['node']}: {verdict['line']}"
    record_result(job.run_dir, found.rendezvous_id, found, code, line)
    if code:
        print(f"{RESULT_PREFIX}{found.name} exit {code} ({meaning(code, attempts_left)}): {line or '-'}", flush=True)
    return code


def main() -> int:
    env = dict(os.environ)
    try:
        found = place(env)
    except ValueError as error:
        print(f"{RESULT_PREFIX}cannot start: {error}", file=sys.stderr, flush=True)
        return EXIT_CANNOT_START
    code = run(found, env)
    # The node's result is decided and recorded: a stop now (Batch stops the child nodes once the main node exits,
    # which may be while this one exits too) must not end it with 143 instead, as SIGTERM's default action would
    # once the interpreter, shutting down, restores it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    sys.exit(main())
