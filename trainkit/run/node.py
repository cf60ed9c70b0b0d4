"""One node of a job on a cluster target, as each target's entry point on the node runs it (the EKS pod's,
trainkit/backends/eks/pod.py; a SageMaker host's, trainkit/backends/sagemaker/host.py): prepare the run where its
folder lives, start torchrun with a failure channel its ranks report to, pass a stop on to it, and end with an exit
code and one line that say why. The entry point puts that line where its scheduler shows it (a pod's termination
message, SageMaker's failure file).

The exit code is what the training operator's `ExitCode` restart policy decides on (training-operator v1.9.4,
pkg/controller.v1/common/pod.go ReconcilePods; pkg/util/train/train_util.go: 128 and above retryable, 1-127
permanent); SageMaker fails a job on any code but 0, so the same codes serve it:

    0                 torchrun finished
    2                 the job cannot start here (its preparation refused it): permanent
    EXIT_NO_RETRY (3) a rank's failure no restart mends (a full volume, bad data, ...): permanent
    1                 torchrun spent its own restarts (--max-restarts): permanent
    128 + signal      torchrun or this process was killed or stopped (a node's fault, an eviction): the operator
                      replaces the pod
    EXIT_REPLACE (192) torchrun could not meet its peers (EXIT_RENDEZVOUS: the store's node was lost, the store
                      unreachable, a store call failed): retryable, the operator replaces the pod, which then meets
                      the others again. A closed rendezvous (the job ended on another node, or a rendezvous timed
                      out, which closes it) would meet every new pod closed: the agent calls that permanent
                      (EXIT_NO_RETRY), so it cannot loop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from training.common.failure import EXIT_NO_RETRY, redact
from training.spec import SUMMARY_FILE, Job
from trainkit.errors import SpecError
from trainkit.run.agent import EXIT_RENDEZVOUS
from trainkit.run.failures import FailureChannel, failure_summary, forget_failure, record_failure, wait_for_records
from trainkit.run.stalls import stall_elsewhere
from trainkit.run.state import run_summary, stopped_early
from trainkit.run.torchrun import Placement, torchrun_command
from trainkit.run.tracked import FAILED, FINISHED, end_tracked
from trainkit.run.workload import Workload, ready

# 128 and above is retryable to the ExitCode policy; not 128 + a signal's number, so no signal is implied.
EXIT_REPLACE = 192
EXIT_CANNOT_START = 2


def node_exit_code(torchrun_code: int, cause: dict | None, received: int | None) -> int:
    """The node's exit code (see the module's docstring)."""
    if torchrun_code == EXIT_NO_RETRY or (cause is not None and cause.get("permanent")):
        return EXIT_NO_RETRY  # even when a stop came after: what ended the run would end a new node too
    if received is not None:
        return 128 + received
    if torchrun_code == 0:
        return 0
    if torchrun_code == EXIT_RENDEZVOUS:
        return EXIT_REPLACE
    if torchrun_code < 0:  # killed by a signal
        return 128 - torchrun_code
    return torchrun_code


def run_node(
    job: Job,
    workload: Workload,
    endpoint: str,
    rdzv_id: str,
    name: str,
    report: Callable[[str], None],
    placement: Placement | None = None,
    ended: Callable[[str], None] | None = None,
) -> int:
    """Prepare the run, run torchrun (rendezvous `endpoint`, `rdzv_id`, the node's `placement`), and return the
    node's exit code; the cause of a failure goes to stderr and to `report` as one line naming the node. A run that
    stopped early says so on the console and to `ended` (trainkit/run/state.py EARLY: what remote status reads)."""
    # From the start: a SIGTERM (the node being stopped) before torchrun runs ends this process with 128 + signal
    # at once; after, it is passed on to torchrun, which stops its workers at a step boundary.
    received: list[int] = []
    agent: subprocess.Popen | None = None

    def forward(signum, _frame):
        received.append(signum)
        if agent is None:
            sys.exit(128 + signum)
        with contextlib.suppress(ProcessLookupError):
            agent.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    said = len(job.run.notes)
    try:
        run = ready(job, workload)
    except SpecError as error:
        line = redact(f"{name}: run {job.run.run_id} cannot start: {error}")
        print(f"error: {line}", file=sys.stderr, flush=True)
        report(line)
        return EXIT_CANNOT_START
    for note in job.run.notes[said:]:  # what the preparation found (a run continued at another size)
        print(f"{name}: note: {note}", flush=True)
    forget_failure(job.run_dir, submission=rdzv_id)  # an earlier job's cause no longer says why this one stops
    log_dir = job.run_dir / "logs" / name
    command = torchrun_command(run, endpoint, rdzv_id, log_dir, placement=placement)
    print(f"{name}: run {job.run.run_id} in {job.run_dir.resolve()}", flush=True)
    started = time.time()
    with FailureChannel() as channel:
        agent = subprocess.Popen(command, env={**os.environ, **run.env, **channel.env})
        code = agent.wait()
        if code:
            wait_for_records(channel)
        cause = channel.cause()
    exit_code = node_exit_code(code, cause, received[0] if received else None)
    if exit_code and finished_since(job.run_dir, started):
        # The run published its summary in this launch, so the training finished (on this node or another); this
        # node was stopped after that (an operator that ends a job once one worker succeeds stops the rest, a
        # scheduler ending the job): its workers' "stopped" is no failure of the run, and the node's work is done.
        print(f"{name}: stopped after run {job.run.run_id} finished (torchrun exit {code})", flush=True)
        exit_code = 0
    if exit_code == 0:
        # The training finished: what this job recorded on the way (a node replaced after a retryable failure, whose
        # record its replacement kept as its peers' news) is history now, not why the run stands where it is.
        forget_failure(job.run_dir)
        early = stopped_early(run_summary(job.run_dir))
        if early:
            line = f"{name}: run {job.run.run_id} finished: {early}"
            print(line, flush=True)
            if ended is not None:
                ended(line)
    elif cause is not None:
        # A stall another node's watchdog pinned on its rank is the cause here too (this node's ranks waited for that
        # rank), so every node's line, whichever its scheduler shows, names the rank that hung.
        elsewhere = None if received else stall_elsewhere(job.run_dir, cause)
        who, cause = (elsewhere["node_name"], elsewhere) if elsewhere else (name, cause)
        line = f"{who}: {failure_summary(cause)}"
        print(f"error: {line}", file=sys.stderr, flush=True)
        report(line)
        record_failure(job.run_dir, cause, exit_code, rdzv_id)  # beside the run too, when its volume takes it
    else:
        line = f"{name}: torchrun exited with code {code}; every rank's log: {log_dir}"
        report(line)
    track_end(job, exit_code, line if exit_code else None)
    return exit_code


def track_end(job: Job, exit_code: int, cause: str | None) -> None:
    """The MLflow run's end, from each node whose end is the run's: FINISHED when it finished (every node says so: the
    same state, the same files), FAILED with the node's line when no restart mends it. A code the scheduler retries
    (128 and above: a lost node, an eviction, a spot interruption) ends nothing: the replacement continues the same
    MLflow run."""
    if exit_code == 0:
        end_tracked(job, FINISHED)
    elif exit_code in (1, EXIT_NO_RETRY):
        end_tracked(job, FAILED, cause)


def finished_since(run_dir: Path, started: float) -> bool:
    """Whether the run published its summary.json (its last act, training/common/run.py) at or after `started`."""
    try:
        return (run_dir / SUMMARY_FILE).stat().st_mtime >= started
    except OSError:
        return False
