"""A run's state is one typed value on every target (trainkit/run/state.py): each target's table covers every state
its service can report, read from the service's own model where one ships with the tools (botocore), and the
values mean the same thing everywhere."""

from __future__ import annotations

import re
from pathlib import Path

import botocore.session
import pytest

from tests.helpers import kube_api
from trainkit.backends.batch.jobs import STOPPED_REASON
from trainkit.run import state
from trainkit.run.state import RunState


def enum_of(service: str, shape: str) -> list[str]:
    return botocore.session.get_session().get_service_model(service).shape_for(shape).enum


def test_every_state_sagemaker_and_batch_report_has_a_run_state():
    assert set(state.SAGEMAKER) == set(enum_of("sagemaker", "TrainingJobStatus"))
    assert set(state.SAGEMAKER_NOT_YET) <= set(enum_of("sagemaker", "SecondaryStatus"))
    assert set(state.BATCH) == set(enum_of("batch", "JobStatus"))


def test_every_condition_the_operator_stand_in_writes_has_a_run_state():
    """The conditions the operator's stand-in sets (tests/helpers/kube_api.py `set_condition`, with the operator's
    reasons) are all in the table, which holds v1.9.4's six."""
    source = Path(kube_api.__file__).read_text()
    written = set(re.findall(r'set_condition\([^,]+, "(\w+)", "PyTorchJob\w+"', source))
    assert {"Created", "Running", "Succeeded", "Failed", "Restarting"} <= written <= set(state.PYTORCHJOB), written
    assert len(state.PYTORCHJOB) == 6


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        (state.sagemaker_state("InProgress", "Starting"), RunState.PENDING),
        (state.sagemaker_state("InProgress", "Training"), RunState.RUNNING),
        (state.sagemaker_state("InProgress", "Restarting"), RunState.RUNNING),
        (state.sagemaker_state("Stopped", "MaxRuntimeExceeded"), RunState.STOPPED),
        (state.batch_state("RUNNABLE", None, STOPPED_REASON), RunState.PENDING),
        (state.batch_state("FAILED", STOPPED_REASON, STOPPED_REASON), RunState.STOPPED),
        (state.batch_state("FAILED", "Essential container in task exited", STOPPED_REASON), RunState.FAILED),
        (state.pytorchjob_state([]), RunState.PENDING),
        (state.pytorchjob_state(["Created", "Running", "Restarting"]), RunState.RUNNING),
        (state.pytorchjob_state(["Created", "Succeeded"]), RunState.FINISHED),
    ],
)
def test_each_targets_word_means_the_same_state(found, expected):
    assert found is expected


def test_ended_states_hold_no_machine():
    assert {s for s in RunState if s.ended} == {RunState.FINISHED, RunState.STOPPED, RunState.FAILED, RunState.LOST}
