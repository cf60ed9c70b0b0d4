"""The unit layer runs in-process: a test here that starts a process fails, and says why.

subprocess.Popen is replaced for the duration of each test by tests/helpers/guards.py's RefusedPopen.
Importing subprocess, or code that merely could start a process, is untouched.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers.guards import RefusedPopen
from trainkit import hardware


@pytest.fixture(scope="session", autouse=True)
def gpus_counted_once():
    """trainkit.hardware.local_gpu_count() asks nvidia-smi once per process (it is cached), and building a job
    in-process calls it. Ask before the first unit test, so that on a machine with GPUs the specs built
    here see them as before instead of tripping the guard (on a machine without nvidia-smi nothing runs)."""
    hardware.local_gpu_count()


@pytest.fixture(autouse=True)
def no_processes(monkeypatch, gpus_counted_once):
    """Starting a process in a unit test raises ProcessInUnitTest."""
    monkeypatch.setattr(subprocess, "Popen", RefusedPopen)
