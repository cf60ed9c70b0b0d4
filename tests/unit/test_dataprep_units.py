"""What `invoke data.imagenet --target eks --follow` says while no pod of its Job runs (an image that cannot be
pulled, nothing to schedule on, no pod created), instead of waiting in silence."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from trainkit.backends.eks import rules
from trainkit.backends.eks import task as dataprep
from trainkit.errors import SpecError


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
    assert rules.fsx_relative("/fsx/imagenet", "--dest") == "imagenet"
    assert rules.fsx_relative("data/imagenet", "--dest") == "data/imagenet"
    for bad in ("/fsx", "/fsx/../etc", "/data/x"):
        with pytest.raises(SpecError, match="/fsx"):
            rules.fsx_relative(bad, "--dest")


def test_a_local_task_ends_with_its_own_error_line_held_back_for_the_failure():
    """The local data copy runs in the launcher's process: its progress passes at once, and the `error: ...` line
    it ends with becomes the failure's one line instead of being printed twice."""
    import io

    from trainkit.backends.local.task import HeldErrors

    console = io.StringIO()
    held = HeldErrors(console)
    for chunk in ("copy: 10%\r", "copy: 20%\r", "err", "or: nothing found under s3://b/p", "\n", "tail\n"):
        held.write(chunk)
    held.flush()
    assert console.getvalue() == "copy: 10%\rcopy: 20%\rtail\n" and held.last == "nothing found under s3://b/p"
