"""--max-runtime where SageMaker and Batch hold it, on their stand-ins: a job whose entry point only sleeps (and
records the signal it gets) is created straight through the API with a 2 s limit, no training; at the limit every
host or node gets SIGTERM, the job ends in the state the service gives a job stopped at its limit, and `invoke
status` says in one line that the --max-runtime deadline stopped it and how to resume. The stand-ins' rules, with
their sources, are in tests/helpers/sagemaker_standin.py and tests/helpers/batch_standin.py; the renderings that
carry the limit are checked in test_sagemaker_submit.py and test_aws_batch_submit.py."""

from __future__ import annotations

import contextlib
import signal

import pytest

from tests.helpers.batch_moto import batch_account
from tests.helpers.sagemaker_moto import sagemaker_account
from trainkit.backends import get_backend
from trainkit.backends.aws import stamp
from trainkit.backends.base import RunRef
from trainkit.backends.batch import request as batch_request
from trainkit.backends.sagemaker import request as sagemaker_request

LIMIT_S = 2
SIGNALS_ENV = "TEST_SIGNALS_DIR"
SLEEPER = f"""
import os, pathlib, signal, sys, time
def record(signum, frame):
    (pathlib.Path(os.environ["{SIGNALS_ENV}"]) / str(os.getpid())).write_text(str(signum))
    sys.exit(0)  # a clean exit: the service, not the exit code, decides how the job ends
signal.signal(signal.SIGTERM, record)
time.sleep(600)
"""


def received(folder) -> list[int]:
    """The signal each container's entry point recorded, one per process."""
    return sorted(int(path.read_text()) for path in folder.iterdir())


def status_causes(target: str, run_id: str) -> list[str]:
    """The cause lines of what `invoke status --run-id <run id> --target <target>` prints."""
    text = get_backend(target).status(RunRef(run_id)).text
    return [line.strip() for line in text.splitlines() if line.strip().startswith("cause: ")]


@pytest.fixture
def emulated(tmp_path, monkeypatch):
    """Enter an account (sagemaker_account or batch_account) that runs its jobs, with the commands pointed at it."""
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))
    with contextlib.ExitStack() as stack:

        def enter(account_of):
            account = stack.enter_context(account_of(tmp_path, run_jobs=True))
            for name, value in account.env.items():
                monkeypatch.setenv(name, value)
            return account

        yield enter


def test_sagemaker_stops_a_job_at_max_runtime_in_seconds(tmp_path, emulated):
    account = emulated(sagemaker_account)
    signals = tmp_path / "signals"
    signals.mkdir()
    name = sagemaker_request.job_name("dl", stamp())
    account.client("sagemaker").create_training_job(
        TrainingJobName=name,
        AlgorithmSpecification={
            "TrainingImage": account.image,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["python", "-c", SLEEPER],
        },
        RoleArn=account.stack["role_arn"],
        OutputDataConfig={"S3OutputPath": f"s3://{account.stack['bucket']}/output"},
        ResourceConfig={"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2, "VolumeSizeInGB": 100},
        StoppingCondition={"MaxRuntimeInSeconds": LIMIT_S},
        Environment={SIGNALS_ENV: str(signals)},
    )
    described = account.wait(name, timeout=60)
    assert (described["TrainingJobStatus"], described["SecondaryStatus"]) == ("Stopped", "MaxRuntimeExceeded")
    assert "FailureReason" not in described
    assert described["TrainingTimeInSeconds"] >= LIMIT_S  # an ended job's, billed as long
    transitions = described["SecondaryStatusTransitions"]
    assert [t["Status"] for t in transitions][-3:] == ["Training", "Stopping", "MaxRuntimeExceeded"]
    assert "EndTime" in transitions[-1]
    trained = transitions[-2]["StartTime"] - transitions[-3]["StartTime"]
    assert trained.total_seconds() >= LIMIT_S  # not stopped before its limit
    assert received(signals) == [signal.SIGTERM] * 2  # each host's entry point, which then exited by itself
    (cause,) = status_causes("sagemaker", "dl")
    assert cause.startswith(
        f"cause: stopped at its --max-runtime deadline ({LIMIT_S} s of training, StoppingCondition.MaxRuntimeInSeconds)"
    )
    assert cause.endswith("submit again with --run-id dl to resume with a fresh window")


def test_batch_terminates_an_attempt_at_its_timeout_and_does_not_retry_it(tmp_path, emulated):
    batch = emulated(batch_account)
    signals = tmp_path / "signals"
    signals.mkdir()
    client = batch.client("batch")
    container = {
        "image": batch.image,
        "command": ["python", "-c", SLEEPER],
        "environment": [{"name": SIGNALS_ENV, "value": str(signals)}],
        "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "512"}],
    }
    definition = client.register_job_definition(
        jobDefinitionName="sleeper",
        type="multinode",
        nodeProperties={
            "numNodes": 2,
            "mainNode": 0,
            "nodeRangeProperties": [{"targetNodes": "0:", "container": container}],
        },
        timeout={"attemptDurationSeconds": LIMIT_S},
    )
    submitted = client.submit_job(
        jobName=batch_request.job_name("dl", stamp()),
        jobQueue=batch.stack["job_queue_arn"],
        jobDefinition=definition["jobDefinitionArn"],
        retryStrategy={"attempts": 3},  # a timed-out attempt is not retried all the same
    )
    described = batch.wait(submitted["jobId"], timeout=60)
    assert (described["status"], described["statusReason"]) == ("FAILED", "Job attempt duration exceeded timeout")
    (attempt,) = described["attempts"]
    assert attempt["container"]["exitCode"] == 0  # it exited on SIGTERM, before the SIGKILL
    assert (attempt["stoppedAt"] - described["startedAt"]) / 1000 >= LIMIT_S  # not stopped before its limit
    assert received(signals) == [signal.SIGTERM] * 2  # both nodes: the timeout is the whole MNP job's
    (cause,) = status_causes("batch", "dl")
    assert cause.startswith(
        f"cause: stopped at its --max-runtime deadline ({LIMIT_S} s from the attempt's start, "
        "timeout.attemptDurationSeconds)"
    )
    assert cause.endswith("submit again with --run-id dl to resume with a fresh window")
