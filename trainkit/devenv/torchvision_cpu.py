"""Detect a CPU-only torch next to a CUDA torchvision and, only then, install the import shim.

    python -m trainkit.devenv.torchvision_cpu      # run by `make setup`; prints what it did

Exit 0 when `import torchvision` works afterwards (with or without the shim), 1 otherwise.
See `torchvision_cpu_shim.py` for what the shim does and does not make available.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

SHIM_SOURCE = Path(__file__).with_name("torchvision_cpu_shim.py")
SHIM_MODULE = "_trainkit_torchvision_cpu_shim"
_PROBE = "import torch, torchvision; print(torch.version.cuda or 'cpu', torchvision.__version__)"


def probe(python: str = sys.executable) -> tuple[bool, str]:
    """(imports?, last line of output or of the error) for `import torch, torchvision` in a fresh interpreter."""
    result = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, check=False)
    text = (result.stdout if result.returncode == 0 else result.stderr).strip()
    return result.returncode == 0, text.splitlines()[-1] if text else ""


def torch_is_cpu_only(python: str = sys.executable) -> bool:
    result = subprocess.run(
        [python, "-c", "import torch; print(torch.version.cuda is None)"], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() == "True"


def install_shim(site_packages: Path) -> list[Path]:
    module = site_packages / f"{SHIM_MODULE}.py"
    pth = site_packages / f"{SHIM_MODULE}.pth"
    shutil.copyfile(SHIM_SOURCE, module)
    pth.write_text(f"import {SHIM_MODULE}\n")
    return [module, pth]


def main() -> int:
    ok, detail = probe()
    if ok:
        shimmed = (Path(sysconfig.get_paths()["purelib"]) / f"{SHIM_MODULE}.pth").is_file()
        print(f"torchvision: imports ({detail}){' with the CPU shim' if shimmed else ''}")
        return 0
    if "torchvision::" not in detail or not torch_is_cpu_only():
        print(f"torchvision: import fails for a reason the CPU shim does not cover: {detail}", file=sys.stderr)
        return 1
    written = install_shim(Path(sysconfig.get_paths()["purelib"]))
    ok, after = probe()
    if not ok:
        print(f"torchvision: still fails after installing the CPU shim: {after}", file=sys.stderr)
        return 1
    print(
        "torchvision: CUDA build next to a CPU-only torch; installed the development shim "
        f"({', '.join(p.name for p in written)}) -> imports ({after}); C++ ops and torchvision.io stay unavailable"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
