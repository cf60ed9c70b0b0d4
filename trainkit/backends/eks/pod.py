"""Entry point of every EKS training pod: prepare the run on FSx, run torchrun, and end with an exit code and a
termination message that say why.

The launcher validated the job and put it (spec.json's content) in `TRAINKIT_SPEC`, and what to run in
`TRAINKIT_WORKLOAD`; here the workload's preparation, the same as on the local target (a recipe's `prepare_run`),
writes `runs/<run-id>/` (relative to the FSx mount, the working directory), checks the data and the token (from
the Secret), and torchrun (trainkit/run/agent.py) starts the workload with a failure channel its ranks report
to. Every worker pod does this; the writes are atomic and identical, so
pods may race. A SIGTERM from the kubelet is passed on to torchrun, which stops its workers at a step
boundary.

The pod's exit code is what the operator's `ExitCode` restart policy decides on (training-operator v1.9.4,
pkg/controller.v1/common/pod.go ReconcilePods; pkg/util/train/train_util.go: 128 and above retryable, 1-127
permanent):

    0                 torchrun finished
    2                 the job cannot start here (its preparation refused it): permanent
    EXIT_NO_RETRY (3) a rank's failure no restart mends (a full volume, bad data, ...): permanent
    1                 torchrun spent its own restarts (--max-restarts): permanent
    128 + signal      torchrun or this process was killed or stopped (a node's fault, an eviction):
                      the operator replaces the pod
    EXIT_REPLACE (192) torchrun could not meet its peers (EXIT_RENDEZVOUS: the store's pod was lost,
                      the store unreachable, a store call failed): retryable, the operator replaces the
                      pod, which then meets the others again. A closed rendezvous (the job ended on
                      another pod, or a rendezvous timed out, which closes it) would meet every new pod
                      closed: the agent calls that permanent (EXIT_NO_RETRY), so it cannot loop.

The cause goes, in one line, to the container's termination message (`TERMINATION_LOG`, the file the kubelet
reads into the pod's status when the container ends, so `invoke status` shows it from the API), and to the
pod's log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from training.common.failure import EXIT_NO_RETRY, redact
from training.common.job import Job
from trainkit.backends.base import WORKLOAD_ENV, Workload, ready
from trainkit.backends.eks.render import TERMINATION_LOG
from trainkit.errors import SpecError
from trainkit.run.agent import EXIT_RENDEZVOUS
from trainkit.run.failures import FailureChannel, failure_summary, forget_failure, record_failure, wait_for_records
from trainkit.run.torchrun import torchrun_command

# TERMINATION_LOG_ENV names another file than the container's terminationMessagePath (the tests' stand-in for the
# kubelet's mount there, tests/helpers/kube_api.py).
TERMINATION_LOG_ENV = "TRAINKIT_TERMINATION_LOG"
TERMINATION_MESSAGE_BYTES = 4096
# CODE_MOUNT_ENV names where a user's code is when not at its ConfigMap's mount (render.CODE_MOUNT): the tests'
# stand-in for the kubelet's volume there, as TERMINATION_LOG_ENV is for the termination message.
CODE_MOUNT_ENV = "TRAINKIT_CODE_MOUNT"
# 128 and above is retryable to the ExitCode policy; not 128 + a signal's number, so no signal is implied.
EXIT_REPLACE = 192


def terminate_with(line: str) -> None:
    """Write the termination message, where the kubelet gave the container one (never create the file)."""
    path = Path(os.environ.get(TERMINATION_LOG_ENV, TERMINATION_LOG))
    if path.is_file():
        with contextlib.suppress(OSError):
            path.write_bytes(line.encode()[:TERMINATION_MESSAGE_BYTES])


def pod_exit_code(torchrun_code: int, cause: dict | None, received: int | None) -> int:
    """The container's exit code for the operator's ExitCode policy (see the module's docstring)."""
    if torchrun_code == EXIT_NO_RETRY or (cause is not None and cause.get("permanent")):
        return EXIT_NO_RETRY  # even when a stop came after: what ended the run would end a new pod too
    if received is not None:
        return 128 + received
    if torchrun_code == 0:
        return 0
    if torchrun_code == EXIT_RENDEZVOUS:
        return EXIT_REPLACE
    if torchrun_code < 0:  # killed by a signal
        return 128 - torchrun_code
    return torchrun_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rdzv-endpoint", required=True, help="host:port of the rendezvous store")
    parser.add_argument("--rdzv-id", required=True, help="rendezvous id of this submission")
    args = parser.parse_args(argv)
    job = Job.from_dict(json.loads(os.environ["TRAINKIT_SPEC"]))
    workload = Workload.from_json(os.environ[WORKLOAD_ENV])
    if workload.code is not None and CODE_MOUNT_ENV in os.environ:
        workload = replace(workload, code=os.environ[CODE_MOUNT_ENV])
    pod_name = os.environ.get("POD_NAME", "pod")
    # From the start: a SIGTERM (the kubelet stopping the pod) before torchrun runs ends this process with
    # 128 + signal at once; after, it is passed on to torchrun, which stops its workers at a step boundary.
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
    try:
        run = ready(job, workload)
    except SpecError as error:
        line = redact(f"{pod_name}: run {job.run.run_id} cannot start: {error}")
        print(f"error: {line}", file=sys.stderr, flush=True)
        terminate_with(line)
        return 2
    forget_failure(job.run_dir, submission=args.rdzv_id)  # an earlier job's cause no longer says why this one stops
    log_dir = job.run_dir / "logs" / pod_name
    command = torchrun_command(run, args.rdzv_endpoint, args.rdzv_id, log_dir)
    print(f"{pod_name}: run {job.run.run_id} in {job.run_dir.resolve()}", flush=True)
    with FailureChannel() as channel:
        agent = subprocess.Popen(command, env={**os.environ, **run.env, **channel.env})
        code = agent.wait()
        if code:
            wait_for_records(channel)
        cause = channel.cause()
    exit_code = pod_exit_code(code, cause, received[0] if received else None)
    if exit_code and cause is not None:
        line = f"{pod_name}: {failure_summary(cause)}"
        print(f"error: {line}", file=sys.stderr, flush=True)
        terminate_with(line)
        # Beside the run on FSx too, when the volume takes it.
        record_failure(job.run_dir, cause, exit_code, args.rdzv_id)
    elif exit_code:
        terminate_with(f"{pod_name}: torchrun exited with code {code}; every rank's log: {log_dir}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
