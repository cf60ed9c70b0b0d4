"""Entry point of every EKS training pod: prepare the run on FSx, run torchrun, and end with an exit code and a
termination message that say why.

The launcher validated the job and put it (spec.json's content) in `TRAINKIT_SPEC`, and what to run in
`TRAINKIT_WORKLOAD`; here the workload's preparation, the same as on the local target (a recipe's `prepare_run`),
writes `runs/<run-id>/` (relative to the FSx mount, the working directory), checks the data and the token (from
the Secret), and torchrun (trainkit/run/agent.py) starts the workload with a failure channel its ranks report
to. Every worker pod does this; the writes are atomic and identical, so
pods may race. A SIGTERM from the kubelet is passed on to torchrun, which stops its workers at a step
boundary.

The pod's exit code says whether the operator replaces it (trainkit/run/node.py lists the codes). A pod whose
working directory is not an FSx for Lustre mount (trainkit/run/mounts.py) ends at once with 2, "cannot start": its
run folder would otherwise land on the node's own disk.

The cause goes, in one line, to the container's termination message (`TERMINATION_LOG`, the file the kubelet
reads into the pod's status when the container ends, so `invoke status` shows it from the API), and to the
pod's log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from training.spec import Job
from trainkit.backends.eks import cluster
from trainkit.backends.eks.render import TERMINATION_LOG
from trainkit.run.mounts import NotLustre, require_lustre
from trainkit.run.node import EXIT_CANNOT_START, run_node
from trainkit.run.torchrun import Placement
from trainkit.run.workload import WORKLOAD_ENV, Workload

# TERMINATION_LOG_ENV names another file than the container's terminationMessagePath (the tests' stand-in for the
# kubelet's mount there, tests/helpers/kube_api.py).
TERMINATION_LOG_ENV = "TRAINKIT_TERMINATION_LOG"
TERMINATION_MESSAGE_BYTES = 4096
# CODE_MOUNT_ENV names where a user's code is when not at its ConfigMap's mount (render.CODE_MOUNT): the tests'
# stand-in for the kubelet's volume there, as TERMINATION_LOG_ENV is for the termination message.
CODE_MOUNT_ENV = "TRAINKIT_CODE_MOUNT"


def terminate_with(line: str) -> None:
    """Write the termination message, where the kubelet gave the container one (never create the file)."""
    path = Path(os.environ.get(TERMINATION_LOG_ENV, TERMINATION_LOG))
    if path.is_file():
        with contextlib.suppress(OSError):
            path.write_bytes(line.encode()[:TERMINATION_MESSAGE_BYTES])


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
    remedy = (
        f"the claim {cluster.FSX_CLAIM} mounted there must be bound to the infra stack's FSx for Lustre file system "
        f"(kubectl -n {cluster.JOBS_NAMESPACE} get pvc {cluster.FSX_CLAIM}; terraform/stacks/platform creates it)"
    )
    try:  # the working directory is the FSx claim's mount (render.py): runs/<run-id> is written there
        require_lustre(os.getcwd(), remedy)
    except NotLustre as error:
        line = f"{pod_name}: run {job.run.run_id} cannot start: {error}"
        print(f"error: {line}", file=sys.stderr, flush=True)
        terminate_with(line)
        return EXIT_CANNOT_START
    # The job's etcd identity (the platform etcd's client certificate), where the pod mounts it (submission.py).
    placement = Placement(etcd_tls=os.environ.get(cluster.ETCD_TLS_ENV) or None)
    return run_node(
        job, workload, args.rdzv_endpoint, args.rdzv_id, pod_name, terminate_with, placement, terminate_with
    )


if __name__ == "__main__":
    sys.exit(main())
