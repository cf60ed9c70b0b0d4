"""The option declarations' helper (`option`) and the values the options take; batch arithmetic both sides
share (`micro_steps`, `share`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any

SPEC_FILE = "spec.json"
SUMMARY_FILE = "summary.json"
"""A finished run's summary (training/common/metrics.py publishes it last): the run finished."""
SPEC_VERSION = 2  # spec.json before it (one flat object) is read too: see from_dict

SHARDING_STRATEGIES = ("FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP", "NO_SHARD")
"""FSDP2's strategies (NO_SHARD: DDP)."""
ZERO_1 = "ZERO_1"
"""DeepSpeed ZeRO stage 1: parameters and gradients replicated, the optimizer state partitioned over the ranks."""
SHARDING_CHOICES = (*SHARDING_STRATEGIES, ZERO_1)
TARGETS = ("local", "eks", "sagemaker", "batch")
SYNTHETIC = "synthetic"


def option(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = (),
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    flag: str | None = None,
    alias: str | None = None,
    trains: bool = True,
    family: str | tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None,
    cli: bool = True,
    switch: bool = False,
    duration: bool = False,
) -> Any:
    """One field of the job.

    choices   allowed values (text fields), or a function that names them when asked; minimum/maximum bound
              numbers inclusively, above/below exclusively; every number must also be finite
    flag      the command-line name when it is not the field's name; alias: a second name for it
    trains    whether the value changes what is trained (the run id hashes these; a run can be resumed
              with other values of the rest)
    family    the family (`decoder`, `vision`, `bert`), or families, whose models alone use the field (or a function
              that names them when asked: `text_families`)
    cli       False for values the launcher sets itself (they are still in spec.json)
    switch    a boolean given as a bare flag (`--synthetic`) rather than with a value
    duration  seconds, also given as `90m`, `4h`, `2d` (see duration_seconds)
    """
    meta = {
        "help": help,
        "choices": choices,
        "minimum": minimum,
        "maximum": maximum,
        "above": above,
        "below": below,
        "flag": flag,
        "alias": alias,
        "trains": trains,
        "family": family,
        "cli": cli,
        "switch": switch,
        "duration": duration,
    }
    if isinstance(default, list | dict):
        return field(default_factory=type(default), metadata=meta)
    return field(default=default, metadata=meta)


def micro_steps(global_batch: int, micro_batch: int, world: int) -> int:
    """Forward/backward passes per optimizer step, the same on every rank: enough for the largest share."""
    largest_share = -(-global_batch // world)  # ceiling division
    return -(-largest_share // micro_batch)


def share(global_batch: int, world: int, rank: int) -> tuple[int, int]:
    """(offset, size) of rank's contiguous slice of a global batch: G // world each, the first G % world
    ranks one more. Even when the world divides G (the launcher insists on it unless it chose G itself
    for an elastic range, where no G divides every size)."""
    base, extra = divmod(global_batch, world)
    return rank * base + min(rank, extra), base + (rank < extra)


DATA_FORMATS = ("chat", "alpaca", "prompt-response", "dialogue-summary", "text")
"""The record formats language models read (training/text/formats.py says what each trains on)."""
PACKINGS = ("masked", "concat")
TRUNCATIONS = ("left", "drop")

WORKLOADS = ("recipe", "script", "nccl-test", "data")
