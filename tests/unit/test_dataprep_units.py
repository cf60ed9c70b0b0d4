"""What `invoke data.imagenet --target eks --follow` says while no pod of its Job runs (an image that cannot be
pulled, nothing to schedule on, no pod created), instead of waiting in silence."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from trainkit.errors import SpecError
from trainkit.workloads import imagenet as dataprep


def pod(name: str, phase: str, waiting=None, unscheduled: str | None = None):
    statuses = [NS(state=NS(waiting=waiting))] if waiting else []
    conditions = [NS(type="PodScheduled", status="False", message=unscheduled)] if unscheduled else []
    return NS(metadata=NS(name=name), status=NS(phase=phase, container_statuses=statuses, conditions=conditions))


def test_the_waiting_report_names_each_pending_pods_reason():
    pull = NS(reason="ImagePullBackOff", message="Back-off pulling image x")
    text = dataprep.waiting_report("ns", "job", [pod("job-a", "Pending", waiting=pull)])
    assert text == "waiting: job-a ImagePullBackOff: Back-off pulling image x"
    text = dataprep.waiting_report("ns", "job", [pod("job-b", "Pending", unscheduled="0/3 nodes are available")])
    assert text == "waiting: job-b 0/3 nodes are available"
    assert "has no pod yet" in dataprep.waiting_report("ns", "job", []) and "describe job job" in (
        dataprep.waiting_report("ns", "job", [])
    )
    assert "back-off before a retry" in dataprep.waiting_report("ns", "job", [pod("job-c", "Failed")])


def test_a_destination_is_a_path_on_the_fsx_volume():
    assert dataprep.fsx_relative("/fsx/imagenet", "--dest") == "imagenet"
    assert dataprep.fsx_relative("data/imagenet", "--dest") == "data/imagenet"
    for bad in ("/fsx", "/fsx/../etc", "/data/x"):
        with pytest.raises(SpecError, match="/fsx"):
            dataprep.fsx_relative(bad, "--dest")
