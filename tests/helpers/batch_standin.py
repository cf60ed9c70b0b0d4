"""AWS Batch multi-node parallel (MNP) jobs run here: SubmitJob in the emulated account (tests/helpers/batch_moto.py)
starts the job's nodes as local processes, one container's entry point each, and DescribeJobs, ListJobs and
TerminateJob answer as Batch does. Each rule is Batch's, from the AWS Batch User Guide page (or API reference) in
brackets:

- States ["Job states"]: SUBMITTED -> PENDING -> RUNNABLE -> STARTING -> RUNNING -> SUCCEEDED | FAILED. A job waits
  RUNNABLE until its compute environment has the capacity: here at once when the service runs jobs, for ever when it
  does not (a queue whose instances never come).
- Launch order ["Job lifecycle for MNP jobs"]: the main node is launched first; once its container runs, the child
  nodes are launched.
- Variables ["Environment variables" of MNP jobs, "AWS Batch job environment variables"]: every node gets
  AWS_BATCH_JOB_ID, AWS_BATCH_JOB_ATTEMPT (1, 2 ...), AWS_BATCH_JQ_NAME, AWS_BATCH_CE_NAME, AWS_BATCH_JOB_NODE_INDEX,
  AWS_BATCH_JOB_NUM_NODES and AWS_BATCH_JOB_MAIN_NODE_INDEX; the child nodes also
  AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS, which "isn't present on the main node". AWS_BATCH_JOB_ID is the
  node's id here, `<job id>#<index>` (whether Batch gives a node that or the job's id is not documented:
  trainkit/backends/batch/node.py takes either).
- The container: the definition's command and environment, then the environment of SubmitJob's nodeOverrides for
  the nodes its targetNodes name; each `secrets` entry's value read from Secrets Manager into the environment, and a
  container whose secret cannot be read never starts (Amazon ECS Developer Guide, "Pass Secrets Manager secrets
  through Amazon ECS environment variables": the agent resolves them when the container starts).
- Network ["Compute environment considerations for MNP"]: MNP containers run in awsvpc mode, each with a private IP
  of its own, which the ECS agent serves in the container's task metadata (ECS_CONTAINER_METADATA_URI_V4,
  Networks[].IPv4Addresses; Amazon ECS Developer Guide, "Task metadata endpoint version 4"): served here from a
  local endpoint. Each node's container runs in a network and UTS namespace of its own (tests/helpers/netns.py):
  its eth0 at an address of the job's test network, a new one for each attempt's fresh container, a hostname an
  instance's own that no other node resolves (a VPC's DNS hostnames are not documented for MNP containers); the
  metadata endpoint and the AWS APIs are reached through the network's gateway. The FSx volume every node mounts
  is one shared folder, given as TRAINKIT_BATCH_FSX_ROOT (no container here bind-mounts it at its path).
- Outcome ["Multi-node parallel jobs", "Job lifecycle for MNP jobs"]: the job is finished when the main node exits,
  and the child nodes are then stopped; its status, statusReason and exit code are the main node's. A child that
  exits or dies changes nothing for the others: "AWS Batch doesn't take any action on the other nodes".
- A node's end: its container's exit code, 0 SUCCEEDED, else FAILED with statusReason "Essential container in task
  exited" (ECS's stopped reason). A host failure (`fail_host`): the instance and the node's processes are gone at
  once: FAILED with statusReason "Host EC2 (instance i-...) terminated." and no exit code, the reason the pattern
  "Host EC2*" matches (AWS Compute Blog, "Introducing retry strategies for AWS Batch").
- Retries ["Automated job retries"; API reference, RetryStrategy and EvaluateOnExit]: when the main node fails and
  the attempts are not spent, evaluateOnExit decides: its entries in order, the first whose given conditions all
  match (onStatusReason, onReason, onExitCode: the value itself, or its start when the pattern ends with '*'; '*'
  alone matches anything) gives the action, case aside; no entry matching, or no evaluateOnExit, retries. "Child
  node failures don't cause more attempts"; a new attempt starts every node afresh from RUNNABLE, and each node job's
  attempts grow with the job's. Jobs that are terminated, or time out, are not retried.
- Timeout ["Job timeouts"; API reference, JobTimeout]: attemptDurationSeconds counts from the attempt's startedAt,
  for the whole MNP job ("not ... the individual nodes"); then the job is terminated as by TerminateJob (its
  containers get SIGTERM, and SIGKILL "if the container is still running after 30 seconds") and not retried, with
  statusReason TIMED_OUT (as Batch writes it; the guide does not quote it). Its 60 s minimum is not enforced here,
  so a test can pass the deadline in seconds.
- TerminateJob (API reference: "Jobs that are in the STARTING or RUNNING state are terminated, which causes them to
  transition to FAILED"): a STARTING or RUNNING job's containers are stopped and it ends FAILED with the given
  reason, whatever their exit codes; an earlier one is cancelled. A container is stopped as ECS stops a task:
  SIGTERM to its first process, SIGKILL after ECS_CONTAINER_STOP_TIMEOUT, 30 s (Amazon ECS API reference, StopTask).
- Logs ["Use the awslogs log driver", "Job states"; API reference, ContainerDetail.logStreamName]: each node's
  output goes to the definition's awslogs-group (/aws/batch/job by default), one stream per container attempt,
  `<definition name>/default/<ECS task id>`, named when the container reaches RUNNING.
- ListJobs (API reference): by queue; jobStatus (RUNNING when not given), or a JOB_NAME filter (case-insensitive, a
  trailing '*' matches the start; jobStatus is then ignored); newest first.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.helpers.containers import kill_after_grace, pump_lines, running, signal_container, start_container
from tests.helpers.netns import Network
from tests.helpers.paths import REPO
from trainkit.backends.batch.request import TAG_RUN
from trainkit.run.mounts import STANDIN_FSTYPE_ENV, mount_here

ACTIVE = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")
STOP_GRACE_S = 30.0
EXITED = "Essential container in task exited"
TIMED_OUT = "Job attempt duration exceeded timeout"
DEFAULT_LOG_GROUP = "/aws/batch/job"


def now_ms() -> int:
    return int(time.time() * 1000)


def matches(pattern: str | None, value) -> bool:
    """One evaluateOnExit condition: not given, '*', the value itself, or its start before a trailing '*'."""
    if pattern is None or pattern == "*":
        return True
    if value is None:
        return False
    value = str(value)
    return value.startswith(pattern[:-1]) if pattern.endswith("*") else value == pattern


def evaluate(strategy: dict | None, status_reason: str | None, reason: str | None, exit_code: int | None) -> str:
    """RETRY or EXIT for a failed attempt (the attempts left are counted apart)."""
    for entry in (strategy or {}).get("evaluateOnExit") or []:
        conditions = (
            (entry.get("onStatusReason"), status_reason),
            (entry.get("onReason"), reason),
            (entry.get("onExitCode"), exit_code),
        )
        if all(matches(pattern, value) for pattern, value in conditions):
            return entry["action"].upper()
    return "RETRY"


def node_range(target: str, count: int) -> range:
    start, sep, end = target.partition(":")
    if not sep:
        return range(int(start), int(start) + 1)
    return range(int(start or 0), (int(end) if end else count - 1) + 1)


class Metadata:
    """The ECS task metadata endpoint of every container here: GET /<node job id> -> its container metadata."""

    def __init__(self):
        addresses = {}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                key = self.path.strip("/")
                if key not in addresses:
                    self.send_error(404)
                    return
                body = json.dumps(
                    {"Name": "node", "Networks": [{"NetworkMode": "awsvpc", "IPv4Addresses": [addresses[key]]}]}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.addresses = addresses
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def uri(self, key: str, address: str) -> str:
        self.addresses[key.replace("#", "-")] = address
        return f"http://127.0.0.1:{self.server.server_address[1]}/{key.replace('#', '-')}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Node:
    """One node of one attempt: its container (a process group) and what DescribeJobs says of it."""

    def __init__(self, job: Job, index: int):
        self.job, self.index = job, index
        self.status, self.status_reason = "RUNNABLE", None
        self.exit_code: int | None = None
        self.reason: str | None = None
        self.stream: str | None = None
        self.task = uuid.uuid4().hex
        self.started: int | None = None
        self.stopped: int | None = None
        self.process: subprocess.Popen | None = None
        self.host_lost = False
        self.attempts: list[dict] = []

    @property
    def job_id(self) -> str:
        return f"{self.job.id}#{self.index}"

    def start(self, env: dict, folder: Path, on=None) -> None:
        self.status, self.started = "STARTING", now_ms()
        container = self.job.container()
        try:
            secrets = {s["name"]: self.job.secret(s["valueFrom"]) for s in container.get("secrets", [])}
        except Exception as error:  # the agent cannot resolve a secret: the container never starts
            self.end(None, f"ResourceInitializationError: unable to pull secrets: {type(error).__name__}")
            return
        folder.mkdir(parents=True, exist_ok=True)
        env = {**env, **secrets, "TMPDIR": str(folder)}
        self.process = start_container(container["command"], folder, env, on)
        self.stream = f"{self.job.definition.name}/default/{self.task}"
        self.job.create_stream(self.stream)
        self.status = "RUNNING"
        # The container's output to its stream, a line at a time (CloudWatch takes no empty message).
        put = functools.partial(self.job.put_log, self.stream)
        threading.Thread(target=pump_lines, args=(self.process, put), daemon=True).start()

    def running(self) -> bool:
        return running(self.process)

    def end(self, exit_code: int | None, status_reason: str) -> None:
        """The container ended: a process killed by a signal exits 128 + the signal, as a container's does."""
        if self.status in ("SUCCEEDED", "FAILED"):
            return
        if exit_code is not None and exit_code < 0:
            exit_code = 128 - exit_code
        self.exit_code, self.stopped = exit_code, now_ms()
        self.status = "SUCCEEDED" if exit_code == 0 else "FAILED"
        self.status_reason = status_reason
        self.attempts.append(self.attempt_detail())

    def attempt_detail(self) -> dict:
        container = {"taskArn": f"arn:aws:ecs:us-east-1:123456789012:task/{self.task}"}
        if self.stream:
            container["logStreamName"] = self.stream
        if self.exit_code is not None:
            container["exitCode"] = self.exit_code
        if self.reason:
            container["reason"] = self.reason
        detail = {"container": container, "startedAt": self.started or now_ms(), "statusReason": self.status_reason}
        return {**detail, "stoppedAt": self.stopped} if self.stopped else detail

    def signal(self, sig: int) -> None:
        """SIGTERM to the container's first process; SIGKILL to the whole container (its process group)."""
        signal_container(self.process, sig)

    def describe(self, job: dict) -> dict:
        found = {
            **job,
            "jobId": self.job_id,
            "jobArn": f"{job['jobArn']}#{self.index}",
            "status": self.status,
            "nodeDetails": {"nodeIndex": self.index, "isMainNode": self.index == self.job.main},
            "attempts": list(self.attempts),
            "container": {k: v for k, v in self.attempt_detail()["container"].items()},
        }
        found.pop("nodeProperties", None)
        found.pop("stoppedAt", None)
        found.pop("statusReason", None)
        if self.status_reason:
            found["statusReason"] = self.status_reason
        if self.started:
            found["startedAt"] = self.started
        if self.stopped:
            found["stoppedAt"] = self.stopped
        return found


class Job:
    """One MNP job: its attempts, the nodes of the current one, its states."""

    def __init__(self, service: Service, request: dict, definition, queue, account: str, region: str):
        self.service, self.request, self.definition, self.queue = service, request, definition, queue
        self.id = str(uuid.uuid4())
        self.name = request["jobName"]
        self.arn = f"arn:aws:batch:{region}:{account}:job/{self.id}"
        self.created = now_ms()
        properties = definition.node_properties
        self.count, self.main = int(properties["numNodes"]), int(properties["mainNode"])
        self.strategy = request.get("retryStrategy") or definition.retry_strategy or {"attempts": 1}
        self.timeout = request.get("timeout") or definition.timeout
        self.status, self.status_reason = "SUBMITTED", None
        self.started: int | None = None
        self.stopped: int | None = None
        self.attempts: list[dict] = []
        self.nodes = [Node(self, i) for i in range(self.count)]
        self.terminated: str | None = None
        self.lock = threading.Lock()
        self.folder = service.folder / "jobs" / self.id
        self.network = Network()  # opened when the job runs, closed when it ends or by kill()

    # ---------------------------------------------------------------- what the containers get

    def container(self) -> dict:
        return self.definition.node_properties["nodeRangeProperties"][0]["container"]

    def secret(self, arn: str) -> str:
        return self.service.clients("secretsmanager").get_secret_value(SecretId=arn)["SecretString"]

    def log_group(self) -> str:
        options = (self.container().get("logConfiguration") or {}).get("options", {})
        return options.get("awslogs-group", DEFAULT_LOG_GROUP)

    def create_stream(self, stream: str) -> None:
        logs = self.service.clients("logs")
        with contextlib.suppress(Exception):
            logs.create_log_group(logGroupName=self.log_group())
        logs.create_log_stream(logGroupName=self.log_group(), logStreamName=stream)

    def put_log(self, stream: str, message: str) -> None:
        event = {"timestamp": now_ms(), "message": message}
        logs = self.service.clients("logs")
        logs.put_log_events(logGroupName=self.log_group(), logStreamName=stream, logEvents=[event])

    def environment(self, node: Node, attempt: int, addresses: dict[int, str]) -> dict:
        """The node's container environment; `addresses`: the attempt's nodes' awsvpc addresses by index."""
        container = self.container()
        env = {e["name"]: e["value"] for e in container.get("environment", [])}
        for override in (self.request.get("nodeOverrides") or {}).get("nodePropertyOverrides", []):
            if node.index in node_range(override["targetNodes"], self.count):
                env |= {e["name"]: e["value"] for e in override.get("containerOverrides", {}).get("environment", [])}
        batch = {
            "AWS_BATCH_JOB_ID": node.job_id,
            "AWS_BATCH_JOB_ATTEMPT": str(attempt),
            "AWS_BATCH_JQ_NAME": self.queue.name,
            "AWS_BATCH_CE_NAME": self.queue.environments[0].name,  # where the job is placed: the queue's first
            "AWS_BATCH_JOB_NODE_INDEX": str(node.index),
            "AWS_BATCH_JOB_NUM_NODES": str(self.count),
            "AWS_BATCH_JOB_MAIN_NODE_INDEX": str(self.main),
        }
        if node.index != self.main:
            batch["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = addresses[self.main]
        metadata = self.service.metadata.uri(f"{node.job_id}-{attempt}", addresses[node.index])
        here = {
            "ECS_CONTAINER_METADATA_URI_V4": metadata,
            "TRAINKIT_BATCH_FSX_ROOT": str(self.service.fsx),
            STANDIN_FSTYPE_ENV: mount_here(self.service.fsx).fstype,  # the folder stands for FSx for Lustre
            "PYTHONPATH": str(REPO),
        }
        extra = self.service.run_env.get((self.request.get("tags") or {}).get(TAG_RUN), {})
        return self.network.reach({**os.environ, **env, **extra, **batch, **here})

    # ---------------------------------------------------------------- the run

    def run(self) -> None:
        try:
            self.network.__enter__()
            self._run()
        except Exception as error:  # the stand-in's own fault: the job fails saying so
            self._finish("FAILED", f"stand-in error: {type(error).__name__}: {error}")
        finally:
            self.network.close()

    def _run(self) -> None:
        for state in ("PENDING", "RUNNABLE"):
            self.status = state
        attempt = 0
        while True:
            attempt += 1
            if self.terminated:
                return
            status_reason, reason, exit_code = self._attempt(attempt)
            left = attempt < int(self.strategy.get("attempts", 1))
            if exit_code == 0 or self.terminated or not left:
                break
            if evaluate(self.strategy, status_reason, reason, exit_code) != "RETRY":
                break
            self.status = "RUNNABLE"
            self.nodes = [self._next_node(node) for node in self.nodes]
        # A terminated job (TerminateJob, the timeout) ends FAILED whatever its containers' exit codes.
        self._finish(
            "SUCCEEDED" if exit_code == 0 and not self.terminated else "FAILED", self.terminated or status_reason
        )

    def _next_node(self, node: Node) -> Node:
        fresh = Node(self, node.index)
        fresh.attempts = node.attempts
        return fresh

    def _attempt(self, attempt: int) -> tuple:
        """One attempt: the main node, then the children once it runs, until the main node ends; (statusReason,
        reason, exit code) of the main node."""
        folder = self.folder / f"attempt-{attempt}"
        main = self.nodes[self.main]
        self.status, started = "STARTING", now_ms()
        self.started = self.started or started
        hosts = {node.index: self.network.add(f"{attempt}/{node.index}") for node in self.nodes}
        addresses = {index: host.address for index, host in hosts.items()}

        def start(node: Node) -> None:
            on = functools.partial(self.network.command, hosts[node.index])
            node.start(self.environment(node, attempt, addresses), folder / node.job_id.replace("#", "-"), on)

        start(main)
        if main.status == "RUNNING":
            self.status = "RUNNING"
            for node in self.nodes:
                if node is not main and not self.terminated:
                    start(node)
        deadline = started / 1000 + self.timeout["attemptDurationSeconds"] if self.timeout else None
        while main.status not in ("SUCCEEDED", "FAILED"):
            for node in self.nodes:
                code = node.process.poll() if node.process is not None else None
                if code is not None and not node.host_lost:
                    node.end(code, EXITED)
            if deadline is not None and time.time() > deadline and not self.terminated:
                self.terminate(TIMED_OUT)
            time.sleep(0.1)
        # The job is finished when the main node exits: the children are stopped.
        self._stop_nodes([n for n in self.nodes if n is not main])
        for node in self.nodes:
            if node.status not in ("SUCCEEDED", "FAILED"):
                node.end(node.process.poll() if node.process else None, EXITED)
        self.attempts.append(main.attempt_detail())
        return main.status_reason, main.reason, main.exit_code

    def _stop_nodes(self, nodes: list[Node]) -> None:
        """As ECS stops a task: SIGTERM, then SIGKILL after ECS_CONTAINER_STOP_TIMEOUT (STOP_GRACE_S)."""
        for node in nodes:
            node.signal(signal.SIGTERM)
        kill_after_grace(lambda: [n.process for n in nodes], STOP_GRACE_S, poll_s=0.1, reap_s=10)

    def _finish(self, status: str, reason: str | None) -> None:
        self.status_reason, self.stopped = reason, now_ms()
        self.status = status

    # ---------------------------------------------------------------- what the tests and the API do to it

    def fail_host(self, index: int) -> None:
        """The instance of node `index` is gone: its processes are killed at once, and Batch says why."""
        node = self.nodes[index]
        if node.status != "RUNNING":
            raise RuntimeError(f"node {index} of {self.name} is {node.status}, not RUNNING: nothing to fail")
        node.host_lost = True
        node.signal(signal.SIGKILL)
        node.end(None, f"Host EC2 (instance i-{uuid.uuid4().hex[:17]}) terminated.")

    def terminate(self, reason: str) -> None:
        """TerminateJob: a started job's containers are stopped (it ends FAILED with the reason); others cancelled."""
        with self.lock:
            if self.status not in ACTIVE or self.terminated:
                return
            self.terminated = reason
            if self.status not in ("STARTING", "RUNNING"):
                self._finish("FAILED", reason)
                return
        threading.Thread(target=self._stop_nodes, args=(list(self.nodes),), daemon=True).start()

    def kill(self) -> None:
        """The account goes away: nothing of the job may outlive the test."""
        self.terminated = self.terminated or "the account was closed"
        for node in self.nodes:
            node.signal(signal.SIGKILL)
        self.network.close()

    def describe(self) -> dict:
        main = self.nodes[self.main]
        found = {
            "jobArn": self.arn,
            "jobName": self.name,
            "jobId": self.id,
            "jobQueue": self.queue.arn,
            "status": self.status,
            "createdAt": self.created,
            "startedAt": self.started or 0,
            "jobDefinition": self.definition.arn,
            "attempts": list(self.attempts),
            "retryStrategy": self.strategy,
            "nodeProperties": self.definition.node_properties,
            "tags": self.request.get("tags", {}),
            "propagateTags": bool(self.request.get("propagateTags")),
            "platformCapabilities": ["EC2"],
        }
        if self.timeout:
            found["timeout"] = self.timeout
        if self.status_reason:
            found["statusReason"] = self.status_reason
        if self.stopped:
            found["stoppedAt"] = self.stopped
            if main.exit_code is not None:
                found["container"] = {"exitCode": main.exit_code}
        return found

    def summary(self) -> dict:
        """A JobSummary of ListJobs."""
        keys = ("jobArn", "jobId", "jobName", "createdAt", "status", "jobDefinition", "statusReason", "stoppedAt")
        return {key: value for key, value in self.describe().items() if key in keys}


class Service:
    """The Batch jobs of the emulated account: what SubmitJob, DescribeJobs, ListJobs and TerminateJob reach."""

    def __init__(self, folder: Path, clients, run_jobs: bool):
        self.folder, self.clients, self.run_jobs = folder, clients, run_jobs
        self.fsx = folder / "fsx"
        self.fsx.mkdir(parents=True, exist_ok=True)
        self.jobs: dict[str, Job] = {}
        self.metadata = Metadata()
        self.run_env: dict[str, dict] = {}  # run id -> variables a test adds to that run's containers (its tag)

    def submit(self, request: dict, account: str, region: str) -> dict:
        from moto.batch.exceptions import ClientException
        from moto.batch.models import batch_backends

        backend = batch_backends[account][region]
        definition = backend.get_job_definition(request["jobDefinition"])
        if definition is None or definition.status != "ACTIVE":
            raise ClientException(f"Job definition {request['jobDefinition']} does not exist")
        if definition.type != "multinode":
            raise ClientException("this stand-in runs multi-node parallel jobs only")
        queue = backend.get_job_queue(request["jobQueue"])
        if queue is None:
            raise ClientException(f"Job queue {request['jobQueue']} does not exist")
        job = Job(self, request, definition, queue, account, region)
        self.jobs[job.id] = job
        if self.run_jobs:
            threading.Thread(target=job.run, name=f"batch-{job.name}", daemon=True).start()
        else:
            job.status = "RUNNABLE"  # no capacity comes: it waits
        return {"jobArn": job.arn, "jobName": job.name, "jobId": job.id}

    def describe(self, ids: list[str]) -> list[dict]:
        found = []
        for key in ids:
            job_id, _, index = key.rpartition("#") if "#" in key else (key, "", "")
            job = self.jobs.get(job_id.rsplit("/", 1)[-1])
            if job is None:
                continue
            if index:
                if int(index) < job.count:
                    found.append(job.nodes[int(index)].describe(job.describe()))
            else:
                found.append(job.describe())
        return found

    def list(self, queue: str, status: str | None, filters: list | None) -> list[dict]:
        names = [v for f in filters or [] if f.get("name") == "JOB_NAME" for v in f.get("values", [])]

        def wanted(job: Job) -> bool:
            if job.queue.arn != queue and job.queue.name != queue:
                return False
            if filters:
                return any(
                    job.name.lower().startswith(n[:-1].lower()) if n.endswith("*") else job.name.lower() == n.lower()
                    for n in names
                )
            return job.status == (status or "RUNNING")

        return [job.summary() for job in sorted(self.jobs.values(), key=lambda j: -j.created) if wanted(job)]

    def terminate(self, job_id: str, reason: str) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            job.terminate(reason)

    def close(self) -> None:
        for job in self.jobs.values():
            job.kill()
        self.metadata.close()
