"""The gpu image's hash-pinned torch (containers/train/torch-gpu.txt, installed with pip --require-hashes by
containers/train/Dockerfile): what it pins is what the project pins, for the Python the image has."""

from __future__ import annotations

import re
import tomllib

from tests.helpers.paths import REPO
from trainkit.infra.images import TORCH_LOCK

DOCKERFILE = REPO / "containers" / "train" / "Dockerfile"
REQUIREMENT = re.compile(r"^([A-Za-z0-9._-]+)==([^\s\\]+)")


def canonical(name: str) -> str:  # PEP 503
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, tuple[str, list[str]]]:
    """{name: (version, hashes)} as pip reads the file: a requirement, then its `--hash` options."""
    found: dict[str, tuple[str, list[str]]] = {}
    name = None
    for line in (REPO / TORCH_LOCK).read_text().splitlines():
        if match := REQUIREMENT.match(line):
            name = canonical(match[1])
            found[name] = (match[2], [])
        elif (hashed := re.match(r"^\s+--hash=sha256:([0-9a-f]{64})", line)) and name:
            found[name][1].append(hashed[1])
    return found


def test_the_lock_pins_the_projects_torch_with_hashes_for_the_images_python():
    lock = locked()
    assert {"torch", "torchvision", "triton"} <= set(lock)
    assert all(hashes for _, hashes in lock.values()), [n for n, (_, h) in lock.items() if not h]
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {canonical(m[1]): m[2] for m in map(REQUIREMENT.match, declared) if m}
    shared = set(pins) & set(lock)
    assert {"torch", "torchvision", "numpy", "pillow"} <= shared
    assert {name: lock[name][0] for name in shared} == {name: pins[name] for name in shared}
    arguments = dict(re.findall(r"^ARG (TORCH_VERSION|TORCHVISION_VERSION)=(\S+)$", DOCKERFILE.read_text(), re.M))
    assert arguments == {"TORCH_VERSION": lock["torch"][0], "TORCHVISION_VERSION": lock["torchvision"][0]}
    # Made for CPython 3.12, the python3 of the CUDA base (Ubuntu 24.04 "noble" ships 3.12).
    assert re.search(r"^ARG CUDA_BASE=\S+-ubuntu24\.04$", DOCKERFILE.read_text(), re.M)
    assert "--python-version 3.12 --python-platform x86_64-manylinux_2_28" in (REPO / TORCH_LOCK).read_text()
