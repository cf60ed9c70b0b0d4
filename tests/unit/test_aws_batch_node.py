"""The Batch node entry point's reading of what Batch gives a container (trainkit/backends/batch/node.py): its place
from the MNP variables, the main node's own address from the ECS task metadata, the rendezvous of each attempt, the
exit codes the retry strategy reads, and a child's permanent failure taken up by the main node."""

from __future__ import annotations

import io
import json

import pytest

from trainkit.backends.batch import node

MAIN = {
    "AWS_BATCH_JOB_NODE_INDEX": "0",
    "AWS_BATCH_JOB_NUM_NODES": "2",
    "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
    "AWS_BATCH_JOB_ID": "5b1f0c52-8a5e-4c9d-9f00-3f6d1b2a7e10",
    "AWS_BATCH_JOB_ATTEMPT": "2",
}
CHILD = {
    **MAIN,
    "AWS_BATCH_JOB_NODE_INDEX": "1",
    "AWS_BATCH_JOB_ID": "5b1f0c52-8a5e-4c9d-9f00-3f6d1b2a7e10#1",
    "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.1.17",
}


def test_each_node_finds_its_place_and_every_node_of_an_attempt_one_rendezvous():
    main, child = node.place(MAIN), node.place(CHILD)
    assert main.is_main and not child.is_main and (main.count, child.index) == (2, 1)
    # the node's job id may carry `#<index>`; the attempt makes each retry meet afresh
    assert main.rendezvous_id == child.rendezvous_id == "5b1f0c52-8a5e-4c9d-9f00-3f6d1b2a7e10-2"


def test_the_main_node_runs_the_store_and_each_node_is_reached_at_its_awsvpc_address():
    def fetch(own):
        return lambda uri, timeout: io.BytesIO(json.dumps({"Networks": [{"IPv4Addresses": [own]}]}).encode())

    env = {node.METADATA_ENV: "http://169.254.170.2/v4/abc"}
    endpoint, main = node.rendezvous(node.place(MAIN), {**MAIN, **env}, fetch("10.0.1.17"))
    assert endpoint == "10.0.1.17:29400" and (main.is_host, main.local_addr) == (True, "10.0.1.17")
    endpoint, child = node.rendezvous(node.place(CHILD), {**CHILD, **env}, fetch("10.0.1.40"))
    assert endpoint == "10.0.1.17:29400" and (child.is_host, child.local_addr) == (False, "10.0.1.40")
    # the children start after the main node runs and pull the image: more than torch's 600 s to join
    assert child.join_timeout_s == main.join_timeout_s > 600


def test_the_main_node_gets_no_address_variable_and_reads_its_own_from_the_task_metadata():
    metadata = {"Networks": [{"NetworkMode": "awsvpc", "IPv4Addresses": ["10.0.1.5"]}]}

    def fetch(uri, timeout):
        assert uri == "http://169.254.170.2/v4/abc"
        return io.BytesIO(json.dumps(metadata).encode())

    env = {**MAIN, node.METADATA_ENV: "http://169.254.170.2/v4/abc"}
    assert node.own_address(env, fetch) == "10.0.1.5"


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({**CHILD, "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": ""}, "child node 1 has no AWS_BATCH_JOB_MAIN_NODE"),
        ({**MAIN, "AWS_BATCH_JOB_NODE_INDEX": "2"}, "node 2 (main 0) is outside a job of 2 nodes"),
        ({}, "AWS_BATCH_JOB_NODE_INDEX is None: not started as a node of a Batch multi-node parallel job"),
    ],
)
def test_a_container_without_its_place_is_refused(env, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        node.place(env)


def test_torchruns_failure_is_a_new_attempt_and_the_permanent_codes_stay():
    assert node.batch_code(1) == 192  # a worker failed, torchrun restarted nobody: the retry strategy may
    assert [node.batch_code(code) for code in (0, 2, 3, 143, 192)] == [0, 2, 3, 143, 192]


def test_the_main_node_takes_a_childs_permanent_failure_as_its_own(tmp_path):
    main = node.place({**MAIN, "AWS_BATCH_JOB_NUM_NODES": "3"})
    rdzv = main.rendezvous_id
    node.record_result(tmp_path, rdzv, node.place({**CHILD, "AWS_BATCH_JOB_NUM_NODES": "3"}), 3, "rank 1: bad data")
    verdict = node.peer_verdict(tmp_path, rdzv, main, wait_s=0.2)  # node 2 never reports: its instance is gone
    assert verdict == {"code": 3, "line": "rank 1: bad data", "node": "node-1"}
    assert node.peer_verdict(tmp_path, "another-attempt", main, wait_s=0.1) is None  # results are per attempt


def test_a_retryable_end_in_the_last_attempt_is_said_to_end_the_job():
    from trainkit.backends.batch.node import EXIT_NO_RETRY, EXIT_REPLACE, meaning

    assert meaning(EXIT_REPLACE, 2) == "a new attempt may mend it"
    assert meaning(EXIT_REPLACE, 0) == "no attempt left: the job ends"
    assert meaning(EXIT_NO_RETRY, 0) == "not retried" and meaning(143, 1) == "stopped"
