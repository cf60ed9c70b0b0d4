"""The layers themselves: a unit test carries the unit marker, and cannot start a process."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from tests.helpers.guards import ProcessInUnitTest


def test_a_unit_test_is_marked_unit_only(request):
    assert request.node.get_closest_marker("unit") is not None
    assert not {"integration", "e2e", "slow"} & {mark.name for mark in request.node.iter_markers()}


@pytest.mark.parametrize(
    "start",
    [
        lambda: subprocess.run([sys.executable, "-c", "pass"], check=True),
        lambda: subprocess.check_output(["true"]),
        lambda: subprocess.Popen(["true"]),
        lambda: asyncio.run(asyncio.create_subprocess_exec("true")),
    ],
    ids=["run", "check_output", "Popen", "asyncio"],
)
def test_starting_a_process_fails_and_names_the_layer_to_move_to(start):
    with pytest.raises(ProcessInUnitTest, match=r"tests/unit runs in-process only.*tests/integration.*tests/e2e"):
        start()


def test_code_that_only_refers_to_popen_still_works():
    class Wrapped(subprocess.Popen):  # a module that subclasses Popen when imported still imports
        pass

    assert issubclass(Wrapped, subprocess.Popen) and not isinstance(object(), subprocess.Popen)
    assert subprocess.CompletedProcess(["x"], 0).returncode == 0
