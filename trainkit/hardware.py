"""What a machine offers: accelerators on this host, and AWS GPU instance types for plans and jobs."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from importlib.resources import files


@dataclass(frozen=True)
class InstanceType:
    """An AWS GPU instance type as the planner and the job backends see it."""

    name: str
    gpu: str
    gpus: int
    gpu_memory_gib: int
    efa_interfaces: int
    vcpus: int
    memory_gib: int
    """The host's memory (EC2 accelerated computing instance specifications)."""


# One table for Terraform and Python: terraform/modules/gpu-nodegroup/instance_types.json, which the
# module reads with jsondecode; trainkit/tables/instance_types.json is a link to it that the package
# build copies in as package data, so an installed trainkit reads it without the source tree.
INSTANCE_TABLE = ("tables", "instance_types.json")


def _load_instance_types() -> dict[str, InstanceType]:
    table = json.loads(files("trainkit").joinpath(*INSTANCE_TABLE).read_text())
    return {
        name: InstanceType(
            name, row["gpu"], row["gpus"], row["gpu_memory_gib"], row["efa_interfaces"], row["vcpus"], row["memory_gib"]
        )
        for name, row in table.items()
        if not name.startswith("_")
    }


INSTANCE_TYPES = _load_instance_types()


@functools.cache
def local_gpu_count() -> int:
    """NVIDIA GPUs visible on this host, without importing torch (0 when there is no driver)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    if shutil.which("nvidia-smi") is None:
        return 0
    result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return 0
    count = sum(1 for line in result.stdout.splitlines() if line.startswith("GPU "))
    if visible:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    return count


def local_cpu_count() -> int:
    """CPUs this process may run on (respects affinity masks and container limits)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
