"""Let a CUDA build of torchvision import on a CPU-only build of torch (development machines only).

PyPI's torchvision wheels for Linux x86_64 are CUDA builds. Next to a CPU-only torch their C++
extension (`torchvision._C`) does not load, and torchvision's `__init__` then fails in
`_meta_registrations`, which registers fake kernels for C++ operators that do not exist
(`RuntimeError: operator torchvision::nms does not exist`). Every package that imports torchvision
when it is installed (transformers, the accelerate CLI) fails the same way.

This module is copied into the virtual environment's site-packages, with a `.pth` file that imports
it at start-up, by `python -m trainkit.devenv.torchvision_cpu` -- and only where that mismatch is
detected. It installs an import hook that replaces torchvision's two registration modules with
empty ones *only when the C++ extension failed to load*. Models, transforms and datasets work;
C++ operators (nms, roi_align, ...) and `torchvision.io` decoding stay unavailable (decode with PIL).
A machine with a matching torchvision never installs this file; if it is present anyway, a
torchvision whose extension loads is left untouched.
"""

import importlib.abc
import importlib.machinery
import sys

_REGISTRATION_MODULES = ("torchvision._meta_registrations", "torchvision._autograd_registrations")


class _EmptyModuleLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # default module object

    def exec_module(self, module):
        module.__doc__ = "Skipped: torchvision's C++ extension is not loadable with this torch build."


class _SkipRegistrationsWithoutOps(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in _REGISTRATION_MODULES:
            return None
        extension = sys.modules.get("torchvision.extension")
        if extension is None or extension._has_ops():
            return None  # the real module: its operators exist
        return importlib.machinery.ModuleSpec(name, _EmptyModuleLoader())


if not any(isinstance(finder, _SkipRegistrationsWithoutOps) for finder in sys.meta_path):
    sys.meta_path.insert(0, _SkipRegistrationsWithoutOps())
