"""What `invoke status` says of a Batch job (DescribeJobs of the job and its nodes, as the API returns them) and which
jobs are a run's, without an AWS call: the calls themselves run against the emulated account in
tests/integration/test_aws_batch_submit.py and the stand-in in tests/e2e/test_aws_batch_runs.py."""

from __future__ import annotations

from datetime import UTC, datetime

from trainkit.backends.batch import api, jobs, request
from trainkit.backends.batch.node import RESULT_PREFIX
from trainkit.run.state import RunState

JOB_ID = "5b1f0c52-8a5e-4c9d-9f00-3f6d1b2a7e10"


def ms(minute: int) -> int:
    return int(datetime(2026, 11, 26, 3, minute, tzinfo=UTC).timestamp() * 1000)


CONTAINER = {
    "instanceType": "p5.48xlarge",
    "resourceRequirements": [{"type": "GPU", "value": "8"}],
    "environment": [{"name": request.FSX_MOUNT_ENV, "value": "/fsx"}],
    "logConfiguration": {"logDriver": "awslogs", "options": {"awslogs-group": "/aws/batch/job"}},
}
JOB = {
    "jobName": "r1-20261126-030000",
    "jobId": JOB_ID,
    "status": "FAILED",
    "statusReason": "Essential container in task exited",
    "retryStrategy": {"attempts": 2},
    "timeout": {"attemptDurationSeconds": 3600},
    "nodeProperties": {
        "numNodes": 2,
        "mainNode": 0,
        "nodeRangeProperties": [{"targetNodes": "0:", "container": CONTAINER}],
    },
    "attempts": [
        {
            "startedAt": ms(0),
            "stoppedAt": ms(20),
            "container": {"exitCode": 192},
            "statusReason": "Essential container in task exited",
        },
        {"startedAt": ms(25), "stoppedAt": ms(30), "container": {"exitCode": 3}},
    ],
}
NODES = {
    f"{JOB_ID}#0": {
        "jobId": f"{JOB_ID}#0",
        "status": "FAILED",
        "nodeDetails": {"nodeIndex": 0, "isMainNode": True},
        "container": {"exitCode": 3, "logStreamName": "def/default/task0"},
        "statusReason": "Essential container in task exited",
    },
    f"{JOB_ID}#1": {
        "jobId": f"{JOB_ID}#1",
        "status": "FAILED",
        "nodeDetails": {"nodeIndex": 1, "isMainNode": False},
        "container": {"logStreamName": "def/default/task1"},
        "statusReason": "Host EC2 (instance i-0a1b2c3d4e5f67890) terminated.",
    },
}


class FakeBatch:
    def describe_jobs(self, jobs):
        return {"jobs": [JOB if key == JOB_ID else NODES[key] for key in jobs]}


class FakeLogs:
    """Each node's stream: rank 0 (its evaluations) happened to be on the child node."""

    STREAMS = {
        "def/default/task0": [
            "[default0]:r1 step 12/60",
            f"{RESULT_PREFIX}node-0 exit 3 (not retried): node-1: rank 9: bad record",
        ],
        "def/default/task1": [
            "[default0]:r1 eval at step 4: eval_loss=3.1000",
            "[default0]:r1 eval at step 12: eval_loss=2.5000",
            "[default0]:r1 step 12/60",
        ],
    }

    def get_log_events(self, logGroupName, logStreamName, startFromHead, limit):  # noqa: N803 - boto3's names
        assert (logGroupName, startFromHead) == ("/aws/batch/job", False)
        return {"events": [{"message": line} for line in self.STREAMS[logStreamName]]}


def clients(service: str):
    return {"batch": FakeBatch(), "logs": FakeLogs()}[service]


def test_status_shows_each_attempt_each_node_and_the_cause_the_main_node_logged():
    found = jobs.status(clients, "r1", JOB_ID)
    lines = found.text.splitlines()
    assert found.state is RunState.FAILED
    assert lines[0] == f"Batch job r1-20261126-030000 (run r1), id {JOB_ID}: failed"
    assert lines[1] == "  status FAILED, 2 x p5.48xlarge, attempt 2 of 2, timeout 3600 s per attempt"
    assert lines[2] == "  reason: Essential container in task exited"
    assert (
        lines[3]
        == "  attempt 1: 2026-11-26 03:00:00 -> 2026-11-26 03:20:00  exit 192, Essential container in task exited"
    )
    assert lines[4] == "  attempt 2: 2026-11-26 03:25:00 -> 2026-11-26 03:30:00  exit 3"
    assert lines[5] == "  node 0 (main) FAILED, exit 3, Essential container in task exited"
    assert lines[6] == "  node 1 FAILED, no exit code, Host EC2 (instance i-0a1b2c3d4e5f67890) terminated."
    assert lines[7] == "  cause: node-0 exit 3 (not retried): node-1: rank 9: bad record"
    assert lines[8] == "  eval at step 12: eval_loss=2.5000"  # the last evaluation, from rank 0's node
    assert lines[9] == "  run folder /fsx/runs/r1 (FSx)"


def test_a_runs_jobs_are_its_name_a_dash_and_a_stamp():
    prefix = request.job_name("bert-1.5b-abc", "")[:-1]
    assert prefix == "bert-1-5b-abc"  # '.' is not in Batch's names
    assert api.of_run(request.job_name("bert-1.5b-abc", "20261126-030000"), prefix)
    assert not api.of_run("bert-1-5b-abc-extra-20261126-030000", prefix)  # another run's that shares the start
    assert not api.of_run("bert-1-5b-abcd-20261126-030000", prefix)


def test_following_the_leader_moves_to_the_next_attempts_stream(monkeypatch):
    """`logs -f`: the node of rank 0 is followed until the job ends, onto the stream of the retry's container."""
    monkeypatch.setattr(jobs, "FOLLOW_POLL_S", 0)
    running = {**JOB, "status": "RUNNING", "nodeProperties": {**JOB["nodeProperties"], "numNodes": 1}}
    states = iter(["RUNNING", "RUNNING", "SUCCEEDED"])
    streams = {"def/default/a1": ["group_rank=0", "[default0]:r1 step 4/8"], "def/default/a2": ["group_rank=0", "done"]}
    current = ["def/default/a1"]

    class Batch:
        def describe_jobs(self, jobs):
            if jobs == [JOB_ID]:
                return {"jobs": [{**running, "status": next(states, "SUCCEEDED")}]}
            stream = current[0]
            current[0] = "def/default/a2"  # the next look finds the second attempt's container
            node = {"jobId": f"{JOB_ID}#0", "status": "RUNNING", "nodeDetails": {"nodeIndex": 0, "isMainNode": True}}
            return {"jobs": [{**node, "container": {"logStreamName": stream}}]}

    class Logs:
        def get_log_events(self, logGroupName, logStreamName, nextToken=None, startFromHead=None):  # noqa: N803
            lines = streams[logStreamName]
            return (
                {"events": [{"message": m} for m in lines], "nextForwardToken": "end"}
                if not nextToken
                else {
                    "events": [],
                    "nextForwardToken": "end",
                }
            )

    fake = {"batch": Batch(), "logs": Logs()}
    printed = list(jobs.logs(fake.__getitem__, "r1", JOB_ID, None, follow=True))
    assert printed[0] == "==> r1-20261126-030000/node-0 (leader)"
    assert printed[1:3] == ["group_rank=0", "[default0]:r1 step 4/8"]
    assert printed[3] == "==> r1-20261126-030000/node-0: a new attempt (def/default/a2)"
    assert printed[4:] == ["group_rank=0", "done"]


def test_status_logs_and_stop_find_a_run_where_this_machine_submitted_it_last(tmp_path, monkeypatch):
    import os

    from trainkit.backends import backend_of

    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))
    for target, when in (("sagemaker", 100), ("batch", 200)):
        path = tmp_path / "state" / target / "r1.json"
        path.parent.mkdir(parents=True)
        path.write_text('{"jobs": []}')
        os.utime(path, (when, when))
    runs = str(tmp_path / "runs")
    assert backend_of("r1", None, runs).name == "batch" and backend_of(None, None, runs).name == "batch"
    os.utime(tmp_path / "state" / "sagemaker" / "r1.json", (300, 300))
    assert backend_of("r1", None, runs).name == "sagemaker"
    assert backend_of("r2", None, runs).name == "eks"  # submitted nowhere from here
