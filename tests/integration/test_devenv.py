"""The torchvision CPU shim: installed only on a CPU-torch + CUDA-torchvision mismatch, inert otherwise;
checked in fresh interpreters (its import hook in-process: tests/unit/test_devenv_hook.py)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig

import pytest

from trainkit.devenv import torchvision_cpu

SITE = sysconfig.get_paths()["purelib"]


def python_without_pth(code: str) -> subprocess.CompletedProcess:
    """This venv's packages without running its .pth files (-S), i.e. as if the shim were not installed."""
    return subprocess.run(
        [sys.executable, "-S", "-c", f"import sys; sys.path.append({SITE!r}); {code}"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_setup_step_reports_that_torchvision_imports():
    result = subprocess.run([sys.executable, "-m", "trainkit.devenv.torchvision_cpu"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("torchvision: imports (")


def test_the_mismatch_is_real_here_and_the_shim_is_what_fixes_it():
    bare = python_without_pth("import torchvision")
    if bare.returncode == 0:
        pytest.skip("torchvision matches torch on this machine: no shim needed")
    assert "operator torchvision::nms does not exist" in bare.stderr
    assert torchvision_cpu.torch_is_cpu_only()
    shimmed = python_without_pth(
        f"import {torchvision_cpu.SHIM_MODULE}; import torchvision, transformers; "
        "from torchvision import models; print(models.resnet50().fc.out_features)"
    )
    assert shimmed.returncode == 0, shimmed.stderr
    assert shimmed.stdout.strip() == "1000"
