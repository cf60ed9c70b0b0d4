"""Build a job from what the user gave: the profile YAML, then the flags (last wins). Pure: it reads the
profile file and probes nothing; values nobody gave stay None for the backend and the recipe to fill.

Every value is typed and checked against its declaration (training/spec/) here, so a bad flag
is refused with the flag's name before anything else looks at it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from training.families import LOADED
from training.spec import FieldSpec, Job, all_fields, by_key, duration_seconds, range_problem
from trainkit import hardware
from trainkit.errors import SpecError


@dataclass(frozen=True)
class Machine:
    """What the place a job runs on offers, as its backend found it."""

    gpus_per_node: int
    process_limit: int | None = None
    """Training processes one machine can host when every node shares it (local), else None."""
    described: str = ""
    """The machine in words, for errors ("2 CPU core(s) and no GPU")."""
    cpus_per_node: int | None = None
    """vCPUs of one node (local: those this process may run on), or None where unknown."""

    def processes(self, nproc: int, nodes: int) -> int:
        """Training processes on one machine: every node's where the nodes share it (local), else one node's."""
        return nproc * nodes if self.process_limit is not None else nproc


def compiler_missing(machine: Machine) -> str | None:
    """Why torch.compile cannot build kernels here, or None: inductor's CPU kernels need a C++ compiler ($CXX,
    else g++), on GPUs Triton's launcher a C compiler ($CC, else gcc, cc or clang)."""
    language, variable, names = (
        ("C", "CC", ("gcc", "cc", "clang")) if machine.gpus_per_node else ("C++", "CXX", ("g++",))
    )
    candidates = [os.environ[variable]] if os.environ.get(variable) else names
    if any(shutil.which(name) for name in candidates):
        return None
    return (
        f"torch.compile builds its kernels with a {language} compiler and this machine has none "
        f"(${variable}, {', '.join(names)})"
    )


def local_machine() -> Machine:
    """This machine as the job model sees it: one training process per GPU, else one per CPU core."""
    gpus, cpus = hardware.local_gpu_count(), hardware.local_cpu_count()
    if gpus:
        return Machine(gpus, process_limit=gpus, described=f"{gpus} GPU(s)", cpus_per_node=cpus)
    return Machine(0, process_limit=cpus, described=f"{cpus} CPU core(s) and no GPU", cpus_per_node=cpus)


def profiles() -> dict[str, Any]:
    """Profile name -> its file (package data, so an installed trainkit finds them too)."""
    folder = resources.files("trainkit.job") / "profiles"
    return {entry.name.removesuffix(".yaml"): entry for entry in folder.iterdir() if entry.name.endswith(".yaml")}


def load_profile(profile: str) -> dict[str, Any]:
    """A profile's values, keyed like the flags (`runs_dir`, `metrics_port`, ...)."""
    known = profiles()
    if profile not in known:
        raise SpecError(f"--profile {profile!r} does not exist; choose one of: {', '.join(sorted(known))}")
    data = yaml.safe_load(known[profile].read_text()) or {}
    unknown = sorted(set(data) - set(by_key()))
    if unknown:
        raise SpecError(f"profile {profile} has unknown keys {unknown}; remove them")
    return data


_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def parse_bool(flag: str, value: str) -> bool:
    """true/false (also yes/no, 1/0, on/off) from the command line, or a SpecError naming the flag."""
    text = value.strip().lower()
    if text in _TRUE + _FALSE:
        return text in _TRUE
    raise SpecError(f"{flag} must be true or false (got {value!r})")


def parse_value(spec: FieldSpec, value: Any) -> Any:
    """A flag arrives as text; give it the field's type."""
    if not isinstance(value, str) or spec.kind is str:
        return value
    if spec.kind is bool:
        return parse_bool(spec.flag, value)
    if spec.duration:
        try:
            return duration_seconds(value, spec.flag)
        except ValueError as error:
            raise SpecError(str(error)) from None
    try:
        return spec.kind(value)
    except ValueError:
        kind = "an integer" if spec.kind is int else "a number"
        raise SpecError(f"{spec.flag} must be {kind} (got {value!r})") from None


def check_field(spec: FieldSpec, value: Any) -> None:
    """The field's own rules: allowed values, type, range, finiteness."""
    if value is None:
        return
    if spec.choices and value not in spec.choices:
        raise SpecError(f"{spec.flag} {value!r} is not valid; choose one of: {', '.join(spec.choices)}")
    problem = range_problem(spec, value)
    if problem:
        raise SpecError(f"{spec.flag} {problem}")


def check_fields(job: Job) -> None:
    for spec in all_fields():
        check_field(spec, spec.get(job))


def _node_range(text: str) -> tuple[str, str]:
    low, _, high = text.partition(":")
    if not (low.isdigit() and high.isdigit()):
        raise SpecError(f"--nodes must be N or MIN:MAX, e.g. 1:2 (got {text!r})")
    return low, high


def build(flags: dict[str, Any], profile: str = "local") -> Job:
    """The profile's values, then the flags (None: not given), typed and checked field by field."""
    given = {key: value for key, value in flags.items() if value is not None}
    unknown = sorted(set(given) - set(by_key()))
    if unknown:
        raise SpecError(f"unknown option(s): {', '.join('--' + u.replace('_', '-') for u in unknown)}")
    if isinstance(given.get("nodes"), str) and ":" in given["nodes"]:
        given["min_nodes"], given["nodes"] = _node_range(given["nodes"])
    merged = {**load_profile(profile), **given}
    job = Job()
    fields = by_key()
    for key, value in merged.items():
        spec = fields[key]
        value = parse_value(spec, value)
        check_field(spec, value)
        spec.set(job, value)
    job.run.profile = profile
    job.run.family_modules = list(LOADED)  # every reader of spec.json imports them before it reads the rest
    return job
