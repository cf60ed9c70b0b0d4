"""`make up PROFILE=aws`, `invoke infra.outputs`, `make down PROFILE=aws` against an AWS emulator (moto server on
127.0.0.1), for tests/e2e/test_infra_e2e.py, in the background from early in the session
(tests/helpers/background.py): about half of its ~90 s is the AWS provider's waiters polling, time the rest of the
suite can use.

Run as `python -m tests.helpers.infra_round_trip FOLDER`: each step's exit code and output, and the kubeconfig
`make up` wrote (and whether `make down` removed it), go to FOLDER/round_trip.json.

The emulator's endpoint and fake credentials come from this environment, never from the product's defaults. moto
lacks placement groups, FSx, EKS add-ons, access entries and pod identity: the root's feature flags switch those
off for this run only, so nothing waits on an API the emulator lacks and the provider keeps its own retries (the
stack's aws_max_retries default), as a real run does. Between Terraform and the emulator sits a proxy that plants
transient faults (tests/helpers/aws_faults.py), as a real network and a throttling API do: during `make up` a
throttled call, during `make down` a dropped connection while a VPC endpoint's deletion is awaited and a throttled
subnet deletion. The record says which faults happened.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers.aws import FAKE_AWS, moto_server
from tests.helpers.aws_faults import FaultyProxy
from tests.helpers.background import Background
from tests.helpers.paths import BIN, REPO
from tests.helpers.pricing_standin import PricingStandIn
from trainkit.plan.prices import OFFLINE_ENV

MODULE = "e2e/test_infra_e2e.py"  # relative to tests/
RESULTS = "round_trip.json"

EMULATOR_TFVARS = """
region                = "us-east-1"
availability_zones    = ["us-east-1a", "us-east-1b"]
gpu_availability_zone = "us-east-1a"
name                  = "tk-e2e"
owner                 = "ci@example.com"
stack_id              = "trainkit-e2e"
public_access_cidrs   = ["203.0.113.0/24"]
gpu_instance_type     = "p5.48xlarge"
gpu_desired_nodes     = 1
gpu_max_nodes         = 2

enable_placement_group = false
enable_fsx             = false
enable_eks_addons      = false
enable_access_entries  = false
enable_pod_identity    = false
"""


STEP_TIMEOUT_S = 500
# The faults each step meets (the first call of each action after the step starts): what the old round trip, with
# the provider's retries pinned to 1, failed on (one dropped connection, DescribeVpcEndpoints, during make down).
FAULTS = {
    "up": {"DescribeVpcs": "throttle"},
    "down": {"DescribeVpcEndpoints": "drop", "DeleteSubnet": "throttle"},
}


def _step(command: list[str], env: dict) -> dict:
    """One command to its end, or killed with everything it started (terraform under make) after STEP_TIMEOUT_S;
    a killed step's return code is None and its output what it had printed."""
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        stderr += f"\n(killed after {STEP_TIMEOUT_S} s)"
        return {"returncode": None, "stdout": stdout, "stderr": stderr}
    return {"returncode": process.returncode, "stdout": stdout, "stderr": stderr}


def _make(target: str, env: dict, var_file: Path) -> dict:
    stack = " --stack infra" if target == "up" else ""
    return _step(["make", target, "PROFILE=aws", f"ARGS=--yes --var-file {var_file}{stack}"], env)


def round_trip(root: Path) -> dict:
    """Each step's result, also written to FOLDER/round_trip.json after every step (a later one that hangs
    leaves the earlier ones readable)."""
    var_file = root / "emulator.tfvars"
    var_file.write_text(EMULATOR_TFVARS)
    state = root / "state"
    kubeconfig = state / "aws" / "kubeconfig"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    moto = moto_server(root / "moto.log", {"MOTO_IAM_LOAD_MANAGED_POLICIES": "true"})
    # The Price List API, which moto lacks, from its stand-in: `make up`'s estimate prices as `invoke plan` does.
    with moto as endpoint, FaultyProxy(endpoint) as proxy, PricingStandIn() as prices:
        env = {**clean, "AWS_ENDPOINT_URL": proxy.endpoint, **FAKE_AWS, "TRAINKIT_STATE_DIR": str(state)}
        env.update(AWS_ENDPOINT_URL_PRICING=prices.url, **{OFFLINE_ENV: "api"})
        record: dict = {"kubeconfig_path": str(kubeconfig), "faults": {}}

        def save(**steps) -> None:
            record.update(steps)
            (root / RESULTS).write_text(json.dumps(record))

        def faulty(step: str, command) -> dict:
            proxy.arm(FAULTS[step])
            before = len(proxy.hits)
            result = command()
            record["faults"][step] = proxy.hits[before:]
            return result

        save(up=faulty("up", lambda: _make("up", env, var_file)))
        save(kubeconfig=json.loads(kubeconfig.read_text()) if kubeconfig.is_file() else None)
        if record["up"]["returncode"] == 0:
            save(outputs=_step([str(BIN / "invoke"), "infra.outputs"], env))
            down = faulty("down", lambda: _make("down", env, var_file))
            save(down=down, kubeconfig_after_down=kubeconfig.exists())
    return record


def start() -> Background:
    command = [sys.executable, "-m", "tests.helpers.infra_round_trip", "{root}"]
    return Background("infra", command, timeout_s=3 * STEP_TIMEOUT_S + 120)  # three steps and the emulator


def result(background: Background) -> dict:
    """What each step did; a round trip that did not get as far as writing its record says why."""
    done = background.result()
    path = background.root / RESULTS
    assert path.is_file(), f"exit {done.returncode}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return json.loads(path.read_text())


if __name__ == "__main__":
    round_trip(Path(sys.argv[1]))
