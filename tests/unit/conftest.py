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


@pytest.fixture(scope="session", autouse=True)
def fonts_listed():
    """matplotlib lists the system's fonts, with `fc-list`, when a process first loads its font manager, unless its
    cache (fontlist-*.json under $MPLCONFIGDIR or $XDG_CACHE_HOME/matplotlib) already holds the list. So the run
    report's unit test started a process on a machine that had never run matplotlib and passed on one that had.
    Load it here, before the guard: the unit layer then behaves the same with or without that cache."""
    from matplotlib import font_manager

    assert font_manager.fontManager.ttflist  # matplotlib ships DejaVu: never empty


@pytest.fixture(scope="session", autouse=True)
def processor_named():
    """Python's platform.processor() runs `uname -p` once per process (then cached). MLflow asks it when imported,
    and DeepSpeed imports MLflow inside a `try ... except Exception` (deepspeed/autotuning/autotuner.py): under the
    guard that import failed half-way, silently, and left MLflow's submodules behind, so every later `import mlflow`
    in the same pytest process broke (the tracking tests of the layers after this one). Ask before the guard."""
    import platform

    platform.processor()


@pytest.fixture(autouse=True)
def no_processes(monkeypatch, gpus_counted_once, fonts_listed, processor_named):
    """Starting a process in a unit test raises ProcessInUnitTest."""
    monkeypatch.setattr(subprocess, "Popen", RefusedPopen)


@pytest.fixture(autouse=True)
def prices_from_the_table(monkeypatch):
    """The unit layer never asks AWS: prices come from the shipped table even where credentials exist."""
    from trainkit.plan.prices import OFFLINE_ENV

    monkeypatch.setenv(OFFLINE_ENV, "table")
