"""What `invoke status / logs / stop` read and do with a submitted Batch job (the AWS Batch User Guide page of each
rule in brackets).

- A multi-node parallel job is described by its id; each node by `<job id>#<index>` ["Multi-node parallel jobs":
  the job's status, statusReason and exit information come from the main node, a child's only from its own id].
- Each node's container writes to CloudWatch Logs in the definition's log group, its stream named in the node's
  container.logStreamName (a new stream for each attempt, given when the container reaches RUNNING;
  `<definition>/default/<ECS task id>` by default ["Job states", "Use the awslogs log driver"]).
- TerminateJob moves a STARTING or RUNNING job to FAILED and cancels one that has not started (API reference); the
  containers are stopped as ECS stops a task: SIGTERM, then SIGKILL after 30 s (Amazon ECS API reference,
  StopTask: ECS_CONTAINER_STOP_TIMEOUT); a terminated job is not retried ["Automated job retries"].
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

from trainkit.backends.aws import Clients
from trainkit.backends.base import deadline_cause_line
from trainkit.backends.batch import api
from trainkit.backends.batch.node import RESULT_PREFIX
from trainkit.backends.batch.request import FSX_MOUNT_ENV
from trainkit.backends.batch.stack import BatchStack
from trainkit.errors import SpecError
from trainkit.infra.outputs import BATCH_ACTIVE
from trainkit.run.state import RunStatus, batch_state, early_in, finished_said
from trainkit.run.torchrun import GROUP_RANK

STOPPED_REASON = "stopped with `invoke stop`"
"""TerminateJob's reason when `invoke stop` ends a job: how `status` tells a stopped job from a failed one."""

FOLLOW_POLL_S = 5.0
DESCRIBE_LIMIT = 100  # DescribeJobs takes at most 100 job ids
DEFAULT_LOG_GROUP = "/aws/batch/job"
TAIL_EVENTS = 200
EVAL_MARK = " eval at step "
"""What an evaluation's line says (training/common/progress.py eval_line), after the run id."""


def newest_job(clients: Clients, stack: BatchStack, run_id: str | None) -> tuple[str, str]:
    """(run id, the id of its newest job); without a run id, the run this machine submitted last."""
    run_id = run_id or api.SUBMITTED.last_run()
    if run_id is None:
        raise SpecError("no Batch run submitted from here: give --run-id")
    submitted = api.SUBMITTED.newest(run_id)
    if submitted is not None:
        return run_id, submitted["id"]
    jobs = api.run_jobs(clients, stack, run_id)
    if not jobs:
        prefix = api.request.job_name(run_id, "")[:-1]
        raise SpecError(f"no Batch job of run {run_id} in queue {stack.job_queue_name} (names start {prefix}-)")
    return run_id, jobs[0]["jobId"]


def describe(clients: Clients, ids: list[str]) -> list[dict]:
    batch, found = clients("batch"), []
    for start in range(0, len(ids), DESCRIBE_LIMIT):
        found += batch.describe_jobs(jobs=ids[start : start + DESCRIBE_LIMIT]).get("jobs", [])
    return found


def described_job(clients: Clients, job_id: str) -> dict:
    found = describe(clients, [job_id])
    if not found:
        raise SpecError(f"Batch has no job {job_id} any more (it keeps ended jobs for a while only)")
    return found[0]


def node_container(described: dict) -> dict:
    """The container of the job's node range (one range, `0:`, request.register_request)."""
    return described.get("nodeProperties", {}).get("nodeRangeProperties", [{}])[0].get("container", {})


def node_count(described: dict) -> int:
    return int(described.get("nodeProperties", {}).get("numNodes", 1))


def processes_per_node(described: dict) -> int:
    """A process per GPU the container asks for (request.container)."""
    wanted = {r["type"]: r["value"] for r in node_container(described).get("resourceRequirements", [])}
    return int(wanted.get("GPU", 1))


def nodes(clients: Clients, job_id: str, count: int) -> list[dict]:
    return sorted(describe(clients, [f"{job_id}#{i}" for i in range(count)]), key=lambda n: node_index(n))


def node_index(node: dict) -> int:
    return int(node.get("nodeDetails", {}).get("nodeIndex", node["jobId"].rpartition("#")[2] or 0))


def _clock(value) -> str:
    if value in (None, ""):
        return "-"
    return datetime.fromtimestamp(value / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _exit(container: dict | None) -> str:
    container = container or {}
    code = container.get("exitCode")
    reason = container.get("reason")
    return (f"exit {code}" if code is not None else "no exit code") + (f" ({reason})" if reason else "")


TIMED_OUT = "Job attempt duration exceeded timeout"
"""The statusReason of a job Batch terminated at its timeout.attemptDurationSeconds (--max-runtime), as Batch writes it
(the User Guide's "Job timeouts" says only that Batch terminates the job and does not retry it)."""


def deadline_cause(job: dict, run_id: str) -> str | None:
    """The one line of a job Batch ended at its --max-runtime deadline (DescribeJobs), or None."""
    if job["status"] != "FAILED" or not job.get("statusReason", "").startswith(TIMED_OUT):
        return None
    limit = job.get("timeout", {}).get("attemptDurationSeconds")
    return deadline_cause_line(
        limit,
        "from the attempt's start, timeout.attemptDurationSeconds",
        "Batch stopped the containers (SIGTERM, SIGKILL 30 s later) and retries no timed-out attempt, and the run "
        "saves a checkpoint on FSx at the step boundary when time allows",
        run_id,
    )


def status(clients: Clients, run_id: str, job_id: str) -> RunStatus:
    """The state; the job's status and reason, each attempt's end, each node's state, and the cause its main node
    logged."""
    job = described_job(clients, job_id)
    state = batch_state(job["status"], job.get("statusReason"), STOPPED_REASON)
    container, count = node_container(job), node_count(job)
    total = job.get("retryStrategy", {}).get("attempts", 1)
    done = job.get("attempts", [])
    current = len(done) + (1 if job["status"] in ("STARTING", "RUNNING") else 0)
    timeout = job.get("timeout", {}).get("attemptDurationSeconds")
    lines = [
        "",  # the state, once the nodes' lines are read (below)
        f"  status {job['status']}, {count} x {container.get('instanceType', '?')}, attempt {max(current, 1)} of "
        f"{total}" + (f", timeout {timeout} s per attempt" if timeout else ""),
    ]
    if job.get("statusReason"):
        lines.append(f"  reason: {job['statusReason']}")
    for number, attempt in enumerate(done, 1):
        said = f", {attempt['statusReason']}" if attempt.get("statusReason") else ""
        lines.append(
            f"  attempt {number}: {_clock(attempt.get('startedAt'))} -> {_clock(attempt.get('stoppedAt'))}  "
            f"{_exit(attempt.get('container'))}{said}"
        )
    found = nodes(clients, job_id, count) if job["status"] not in ("SUBMITTED", "PENDING", "RUNNABLE") else []
    for node in found:
        main = " (main)" if node.get("nodeDetails", {}).get("isMainNode") else ""
        ended = f", {_exit(node.get('container'))}" if node["status"] in ("SUCCEEDED", "FAILED") else ""
        reason = f", {node['statusReason']}" if node.get("statusReason") and node["status"] == "FAILED" else ""
        lines.append(f"  node {node_index(node)}{main} {node['status']}{ended}{reason}")
    tails = {node_index(node): node_tail(clients, job, node) for node in found}
    early = early_in(line for tail in tails.values() for line in tail)  # the nodes' own line (trainkit/run/node.py)
    lines[0] = f"Batch job {job['jobName']} (run {run_id}), id {job_id}: {finished_said(state, early)}"
    main = next((node_index(n) for n in found if n.get("nodeDetails", {}).get("isMainNode")), None)
    ended = job["status"] == "FAILED" or done
    cause = deadline_cause(job, run_id) or (main_cause(tails.get(main, [])) if ended else None)
    if cause:
        lines.append(f"  cause: {cause}")
    evaluated = [line.partition(EVAL_MARK)[2] for tail in tails.values() for line in tail if EVAL_MARK in line]
    if evaluated:  # the last evaluation rank 0 printed, on whichever node (training/common/progress.py eval_line)
        lines.append(f"  eval at step {max(evaluated, key=lambda said: int(said.partition(':')[0]))}")
    mount = {e["name"]: e["value"] for e in container.get("environment", [])}.get(FSX_MOUNT_ENV)
    if mount:
        lines.append(f"  run folder {mount}/runs/{run_id} (FSx)")
    return RunStatus(state, "\n".join(lines))


def node_tail(clients: Clients, job: dict, node: dict) -> list[str]:
    """The last TAIL_EVENTS lines of a node's stream (none before it has one)."""
    stream = node.get("container", {}).get("logStreamName")
    if not stream:
        return []
    page = clients("logs").get_log_events(
        logGroupName=log_group(job), logStreamName=stream, startFromHead=False, limit=TAIL_EVENTS
    )
    return [e["message"] for e in page.get("events", [])]


def main_cause(tail: list[str]) -> str | None:
    """The last result line the main node logged (trainkit/backends/batch/node.py)."""
    said = [line for line in tail if line.startswith(RESULT_PREFIX)]
    return said[-1].removeprefix(RESULT_PREFIX) if said else None


def log_group(job: dict) -> str:
    options = node_container(job).get("logConfiguration", {}).get("options", {})
    return options.get("awslogs-group", DEFAULT_LOG_GROUP)


def node_of_group_rank(clients: Clients, job: dict, found: list[dict], group: int) -> dict | None:
    """The node whose agent logged `group` at this attempt's rendezvous (torchrun assigns group ranks as the nodes
    join, not by node index); one round per attempt, as torchrun restarts nobody on Batch."""
    for node in found:
        stream = node.get("container", {}).get("logStreamName")
        if not stream:
            continue
        for line in stream_lines(clients, log_group(job), stream):
            ranks = GROUP_RANK.findall(line)
            if ranks:
                if int(ranks[-1]) == group:
                    return node
                break
    return None


def stream_lines(clients: Clients, group: str, stream: str, token: dict | None = None) -> Iterator[str]:
    """A stream's lines from where `token["next"]` left off (updated as pages are read)."""
    logs, state = clients("logs"), token if token is not None else {}
    while True:
        kwargs = {"nextToken": state["next"]} if state.get("next") else {"startFromHead": True}
        page = logs.get_log_events(logGroupName=group, logStreamName=stream, **kwargs)
        for event in page.get("events", []):
            yield event["message"]
        if page.get("nextForwardToken") in (None, state.get("next")):
            return
        state["next"] = page["nextForwardToken"]


def logs(clients: Clients, run_id: str, job_id: str, rank: int | None, follow: bool) -> Iterator[str]:
    """The leader's output (the node of group rank 0, which holds rank 0; the main node before the rendezvous), or
    one global rank's lines from the node holding it; `follow`: until the job ends, onto the next attempt's stream
    when the job is retried."""
    job = described_job(clients, job_id)
    count, nproc = node_count(job), processes_per_node(job)
    if rank is not None and not 0 <= rank < count * nproc:
        raise SpecError(f"--rank {rank}: job {job['jobName']} has ranks 0-{count * nproc - 1} ({count} x {nproc})")
    found = nodes(clients, job_id, count)
    node = node_of_group_rank(clients, job, found, 0 if rank is None else rank // nproc)
    if node is None and rank is None:  # no rendezvous yet: what the main node says while it starts
        node = next((n for n in found if n.get("nodeDetails", {}).get("isMainNode")), None)
    if node is None or not node.get("container", {}).get("logStreamName"):
        what = "the main node has no log" if rank is None else f"no node has logged group rank {rank // nproc}"
        raise SpecError(f"{what} of job {job['jobName']} yet ({job['status']}): see `invoke status`")
    prefix = "" if rank is None else f"[default{rank % nproc}]:"
    yield f"==> {job['jobName']}/node-{node_index(node)}" + (" (leader)" if rank is None else f" (rank {rank})")
    group, stream, token = log_group(job), node["container"]["logStreamName"], {}
    while True:
        yield from (line for line in stream_lines(clients, group, stream, token) if line.startswith(prefix))
        if not follow:
            return
        status = described_job(clients, job_id)["status"]
        if status in ("SUCCEEDED", "FAILED"):
            follow = False  # one more pass picks up what the last moments wrote
            continue
        time.sleep(FOLLOW_POLL_S)
        again = describe(clients, [node["jobId"]])
        newer = (again[0] if again else {}).get("container", {}).get("logStreamName")
        if newer and newer != stream:  # a new attempt: its container writes a stream of its own
            stream, token = newer, {}
            yield f"==> {job['jobName']}/node-{node_index(node)}: a new attempt ({newer})"


def stop(clients: Clients, job_id: str) -> str:
    job = described_job(clients, job_id)
    if job["status"] not in BATCH_ACTIVE:
        return f"Batch job {job['jobName']} is {job['status']}; nothing to stop"
    clients("batch").terminate_job(jobId=job_id, reason=STOPPED_REASON)
    if job["status"] not in ("STARTING", "RUNNING"):
        return f"cancelled Batch job {job['jobName']} ({job['status']}: it had not started)"
    return (
        f"stopping Batch job {job['jobName']}: its containers get SIGTERM and, 30 s later, SIGKILL; the run saves a "
        "checkpoint at the step boundary when the time allows (on FSx, with the earlier ones), Batch does not retry a "
        "terminated job, and the same `invoke train ... --target batch` resumes it"
    )
