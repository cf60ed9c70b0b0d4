"""Entry point of every EKS training pod: prepare the run on FSx, then become torchrun.

The launcher validated the job and put it (spec.json's content) in `TRAINKIT_SPEC`; here the same
`prepare_run` as on the local target writes `runs/<run-id>/` (relative to the FSx mount, the working
directory), checks the data and the token (from the Secret), and torchrun takes over the process, so
the kubelet's SIGTERM reaches it directly. Every worker pod does this; the writes are atomic and
identical, so pods may race.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from training.common.job import Job

from ...errors import SpecError
from ...launch import prepare_run
from ...torchrun import torchrun_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rdzv-endpoint", required=True, help="host:port of the rendezvous store")
    parser.add_argument("--rdzv-id", required=True, help="rendezvous id of this submission")
    args = parser.parse_args(argv)
    job = Job.from_dict(json.loads(os.environ["TRAINKIT_SPEC"]))
    try:
        run = prepare_run(job)
    except SpecError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    pod_name = os.environ.get("POD_NAME", "pod")
    log_dir = job.run_dir / "logs" / pod_name
    command = torchrun_command(run, args.rdzv_endpoint, args.rdzv_id, log_dir, run.args)
    env = {**os.environ, **run.env}
    print(f"{pod_name}: run {job.run.run_id} in {job.run_dir.resolve()}", flush=True)
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main())
