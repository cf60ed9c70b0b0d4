"""The job: its sections together, every declared field (`all_fields`: the shared schema's and those of the
families that declare options of their own), spec.json's form and reading it back."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.families import FAMILIES, FORMER_NAMES, Family, load_family_modules
from training.spec.adapted import LoraOptions
from training.spec.evaluated import EvaluationOptions
from training.spec.options import SPEC_VERSION
from training.spec.running import CheckpointingOptions, ElasticOptions, ParallelismOptions, PlacementOptions
from training.spec.tracked import TrackingOptions
from training.spec.trained import DataOptions, ModelOptions, OptimisationOptions, RunOptions


@dataclass
class Job:
    """Everything a training job needs, whatever runs it."""

    run: RunOptions = field(default_factory=RunOptions)
    model: ModelOptions = field(default_factory=ModelOptions)
    data: DataOptions = field(default_factory=DataOptions)
    optimisation: OptimisationOptions = field(default_factory=OptimisationOptions)
    parallelism: ParallelismOptions = field(default_factory=ParallelismOptions)
    checkpointing: CheckpointingOptions = field(default_factory=CheckpointingOptions)
    elastic: ElasticOptions = field(default_factory=ElasticOptions)
    placement: PlacementOptions = field(default_factory=PlacementOptions)
    evaluation: EvaluationOptions = field(default_factory=EvaluationOptions)
    lora: LoraOptions = field(default_factory=LoraOptions)
    tracking: TrackingOptions = field(default_factory=TrackingOptions)
    family_options: dict[str, Any] = field(default_factory=lambda: _family_sections())
    """The options of the families that declare their own (Family.options), by family name: spec.json's sections of
    those names."""

    def section(self, name: str) -> Any:
        """A section by name: a shared one (`run`, `model`, ...) or a family's own (`job.section("mlp").width`)."""
        return self.family_options[name] if name in self.family_options else getattr(self, name)

    # ------------------------------------------------------------------ derived values

    @property
    def world_size(self) -> int:
        return self.parallelism.nodes * int(self.parallelism.nproc or 1)

    @property
    def grad_accum_steps(self) -> int:
        o = self.optimisation
        return o.global_batch_size // (o.micro_batch_size * self.world_size)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.runs_dir) / str(self.run.run_id)

    # ------------------------------------------------------------------ spec.json

    def to_dict(self) -> dict[str, Any]:
        data = {"version": SPEC_VERSION, **dataclasses.asdict(self)}
        data.update(data.pop("family_options"))
        batches = self.optimisation.global_batch_size and self.optimisation.micro_batch_size  # a recipe's only
        data["derived"] = {
            "world_size": self.world_size,
            "grad_accum_steps": self.grad_accum_steps if batches else None,
        }
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        """The job `to_dict` wrote; a flat spec.json of an earlier trainkit (one object, the fields' own
        names) is read too, so older runs can be resumed and reported."""
        nested = "version" in data
        if nested:  # a family declared outside trainkit: its module first (its family, models and options)
            load_family_modules(data.get("run", {}).get("family_modules", []))
        job = cls()
        for spec in all_fields():
            source = data.get(spec.section, {}) if nested else data
            key = spec.name if nested else spec.legacy_name
            if key in source:
                spec.set(job, source[key])
        job.model.family = FORMER_NAMES.get(job.model.family, job.model.family)
        if "lr_derived" not in data.get("optimisation", {}):
            # written before the launcher said whose learning rate it was: the run's own counts as chosen, so it is
            # kept where a launch chooses one (a launch that gives --lr must give the run's)
            job.optimisation.lr_derived = True
        return job

    def fingerprint(self) -> str:
        """Hash of the fields that change what is trained (not where logs go, how it is launched or on how many
        processes). A global batch or learning rate the launcher chose counts as the recipe's, whichever world
        size rounded it: the same command at another size names the same run."""
        relevant = {spec.path: spec.get(self) for spec in all_fields() if spec.trains}
        o = self.optimisation
        if o.global_batch_derived:
            relevant["optimisation.global_batch_size"] = "recipe"
        if o.lr_derived:
            relevant["optimisation.lr"] = "recipe"
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:8]


SECTIONS: dict[str, type] = {name: t for name, t in typing.get_type_hints(Job).items() if name != "family_options"}


def _family_sections() -> dict[str, Any]:
    return {family.name: family.options() for family in _own_options()}


def _own_options() -> tuple[Family, ...]:
    """The families with options of their own; a name that would shadow a shared section is refused."""
    found = tuple(family for family in FAMILIES.values() if family.options is not None)
    for family in found:
        if family.name in SECTIONS or family.name == "version":
            raise ValueError(f"model family {family.name!r} takes the name of a spec.json section; rename it")
    return found


@dataclass(frozen=True)
class FieldSpec:
    """One declared option: where it lives, its type and its metadata."""

    section: str
    name: str
    kind: type
    default: Any
    meta: dict[str, Any]

    @property
    def path(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def flag(self) -> str:
        return "--" + (self.meta["flag"] or self.name).replace("_", "-")

    @property
    def key(self) -> str:
        """The flag as a Python identifier (what Invoke passes the task)."""
        return (self.meta["flag"] or self.name).replace("-", "_")

    @property
    def legacy_name(self) -> str:
        """The field's name in the flat spec.json of trainkit before sections."""
        return {"model.name": "model"}.get(self.path, self.name)

    def __getattr__(self, item: str) -> Any:  # help, choices, minimum, ... straight from the metadata
        try:
            return self.meta[item]
        except KeyError:
            raise AttributeError(item) from None

    @property
    def choices(self) -> tuple[str, ...]:
        """Its allowed values (none: any)."""
        named = self.meta["choices"]
        return tuple(named() if callable(named) else named)

    @property
    def families(self) -> tuple[str, ...]:
        """The families whose models alone use it (empty: every model's)."""
        named = self.meta["family"]
        if callable(named):
            named = named()
        return (named,) if isinstance(named, str) else tuple(named or ())

    def get(self, job: Job) -> Any:
        return getattr(job.section(self.section), self.name)

    def set(self, job: Job, value: Any) -> None:
        setattr(job.section(self.section), self.name, value)


def _base_type(annotation: Any) -> type:
    """`int | None` -> int; `list[str]` -> list."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is list:
        return list
    return args[0] if args else annotation


def _declared(section: str, cls: type, family: str | None = None) -> tuple[FieldSpec, ...]:
    """A section's fields; a family's own are for its models alone."""
    specs = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        default = [] if f.default_factory is list else f.default
        meta = dict(f.metadata) | ({"family": family} if family else {})
        specs.append(FieldSpec(section, f.name, _base_type(hints[f.name]), default, meta))
    return tuple(specs)


SHARED_FIELDS: tuple[FieldSpec, ...] = tuple(spec for name, cls in SECTIONS.items() for spec in _declared(name, cls))
"""The shared schema's fields (every section of Job)."""


def all_fields() -> tuple[FieldSpec, ...]:
    """Every declared field: the shared schema's, then each registered family's own (Family.options)."""
    return _with_families(_own_options())


@functools.cache
def _with_families(families: tuple[Family, ...]) -> tuple[FieldSpec, ...]:
    fields = SHARED_FIELDS + tuple(spec for f in families for spec in _declared(f.name, f.options, f.name))
    clash = sorted({spec.key for spec in fields if sum(other.key == spec.key for other in fields) > 1})
    if clash:
        raise ValueError(f"a family's option takes the flag of another option: {', '.join(clash)}; rename it")
    return fields


def by_key() -> dict[str, FieldSpec]:
    """Every field by its flag's identifier (`keep_checkpoints`); the mapping is shared: do not change it."""
    return _keyed(_own_options())


@functools.cache
def _keyed(families: tuple[Family, ...]) -> dict[str, FieldSpec]:
    return {spec.key: spec for spec in _with_families(families)}


def fields_of(cli: bool) -> Iterator[FieldSpec]:
    """The fields that are (or are not) command-line options."""
    return (spec for spec in all_fields() if spec.cli == cli)


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str, flag: str) -> int:
    """`3600`, `90m`, `4h`, `2d` as seconds; anything else is refused naming the flag (a field's minimum refuses 0
    where 0 means nothing)."""
    value = text.strip().lower()
    number, unit = (value[:-1], value[-1]) if value[-1:] in DURATION_UNITS else (value, "s")
    if not number.isdigit():
        raise ValueError(f"{flag} {text!r}: give a whole number of seconds, or minutes, hours or days (90m, 4h, 2d)")
    return int(number) * DURATION_UNITS[unit]


def range_problem(spec: FieldSpec, value: Any) -> str | None:
    """What is wrong with a number for this field (type, finiteness, bounds), or None."""
    if value is None or spec.kind not in (int, float):
        return None
    if spec.kind is int and (not isinstance(value, int) or isinstance(value, bool)):
        return f"must be an integer (got {value!r})"
    if spec.kind is float and not isinstance(value, int | float):
        return f"must be a number (got {value!r})"
    if not math.isfinite(value):
        return f"must be a finite number (got {value!r})"
    low, high, above, below = spec.minimum, spec.maximum, spec.above, spec.below
    if spec.kind is int and low is not None and high is not None:
        ok, wanted = low <= value <= high, f"an integer in {low}..{high}"
    elif spec.kind is int and low is not None:
        ok, wanted = value >= low, f"a {'positive' if low == 1 else 'non-negative'} integer"
    elif above is not None and below is not None:
        ok, wanted = above < value < below, f"between {above:g} and {below:g}, both excluded"
    elif above is not None:
        ok, wanted = value > above, "positive" if above == 0 else f"> {above:g}"
    elif low is not None and below is not None:
        ok, wanted = low <= value < below, f"in [{low:g}, {below:g})"
    elif low is not None:
        ok, wanted = value >= low, f">= {low:g}"
    else:
        ok, wanted = True, ""
    return None if ok else f"must be {wanted} (got {value!r})"


def read_job(path: str | Path) -> Job:
    """The job a run's spec.json describes (what every worker starts from)."""
    return Job.from_dict(json.loads(Path(path).read_text()))
