"""The torchvision CPU shim's import hook, in-process: it skips torchvision's operator registrations only
when the compiled extension did not load, and touches nothing else."""

from __future__ import annotations

import sys
import types

import pytest

from trainkit.devenv import torchvision_cpu_shim


@pytest.mark.parametrize(("has_ops", "skipped"), [(True, False), (False, True)])
def test_the_hook_only_replaces_registrations_when_the_extension_did_not_load(has_ops, skipped, monkeypatch):
    extension = types.SimpleNamespace(_has_ops=lambda: has_ops)
    monkeypatch.setitem(sys.modules, "torchvision.extension", extension)
    finder = torchvision_cpu_shim._SkipRegistrationsWithoutOps()
    for name in torchvision_cpu_shim._REGISTRATION_MODULES:
        assert (finder.find_spec(name) is not None) == skipped
    assert finder.find_spec("torchvision.models") is None  # nothing else is ever touched
