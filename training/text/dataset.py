"""A run's text data as its trainer reads it: the job's dataset, in its format, tokenised and packed once into the
shared cache (cache.py), memory-mapped here. The decoder recipes and the BERT workload both start from `load`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from training.common.checkpoint import this_rank_owns_disk
from training.common.failure import DataError, doing
from training.spec import Job, data_source, eval_data_path

from . import cache, formats, packing, records
from .holdout import has_held_out, held_out_records

DECODER, ENCODER = "decoder", "encoder"
TRAIN, HELD_OUT = "train", "held-out"
"""The parts of a run's text data `load` reads: what it trains on, and what it evaluates on."""
WHOLE, RUN_ON = "whole examples", "run on"
"""How a decoder's examples were packed (packing.py): whole (the supervised formats) or run on (`text`)."""


@dataclass
class TextData:
    """Packed rows (memory-mapped) and where they came from."""

    arrays: dict[str, np.ndarray]
    tokenized: cache.Tokenized

    def __len__(self) -> int:
        return self.arrays["input_ids"].shape[0]

    def rows(self, name: str, indices: torch.Tensor) -> torch.Tensor:
        """Rows `indices` of array `name` as an int64 tensor (a copy: the mapped file stays read-only)."""
        return torch.from_numpy(self.arrays[name][indices.numpy()].astype(np.int64))

    @property
    def meta(self) -> dict:
        return self.tokenized.meta

    def said(self) -> str:
        """One line for the console: what the data became, and whether this run tokenised it."""
        m = self.meta
        rows = f"{m['records']} {m['format']} records -> {m['rows']} sequences of {m['seq_len']} tokens"
        if m.get("packing") == WHOLE:
            rows += f", whole examples, packing efficiency {m['efficiency']:.1%} ({m['padding']} padding tokens"
            rows += f"; {m['truncated']} prompts cut from the left; {m['dropped']} examples left out)"
        elif m.get("dropped"):
            rows += f" ({m['dropped']} without a trained token left out)"
        how = f"tokenised in {m['seconds']:.1f} s" if self.tokenized.built else "tokenised before, read from the cache"
        return f"data: {rows}, {how} ({self.tokenized.folder})"

    def event(self) -> dict:
        m = self.meta
        packed = {key: m[key] for key in ("packing", "efficiency", "padding", "truncated", "dropped") if key in m}
        return {
            "cache": self.tokenized.folder.name,
            "built": self.tokenized.built,
            "format": m["format"],
            "records": m["records"],
            "sequences": m["rows"],
            "seconds": round(self.tokenized.seconds, 3),
            **packed,
        }


def tokenising_processes() -> int:
    """The builder tokenises on every core it may use (the other ranks only wait), at most 16 processes."""
    return max(1, min(len(os.sched_getaffinity(0)), 16))


def load(
    job: Job, run_dir: Path, tokenizer, layout: str, rank: int, part: str = TRAIN, forced: str | None = None
) -> TextData:
    """The job's data for `layout` (DECODER blocks with labels and positions, or ENCODER rows), from the cache: its
    training records (`TRAIN`, less those --eval-fraction holds out) or its held-out ones (`HELD_OUT`)."""
    held_out = job.evaluation
    if part == HELD_OUT and held_out.data:
        source, flag = records.resolve(eval_data_path(job), "--eval-data"), "--eval-data"
        split = held_out.split or "validation"
    else:
        source, split, flag = records.resolve(data_source(job, run_dir)), job.data.dataset_split, "--dataset"
    fraction = held_out.fraction if not held_out.data else None
    forced, seq_len = forced or job.data.data_format, job.data.seq_len
    truncation = job.data.truncation or "left"
    holdout = {"part": part, "fraction": fraction, "seed": job.run.seed} if fraction else None
    key = cache.cache_key(source, split, tokenizer, forced, seq_len, layout, truncation, holdout)
    allowed = formats.ENCODER_FORMATS if layout == ENCODER else formats.FORMAT_NAMES

    def chosen() -> Iterator[tuple[str, dict]]:
        """The records of this part: all of the source's, or those of the fraction's side."""
        if not fraction:
            yield from source.records(split)
            return
        count = sum(1 for _ in source.records(split))
        held = set(held_out_records(count, fraction, job.run.seed).tolist())
        yield from (record for index, record in enumerate(source.records(split)) if (index in held) == (part != TRAIN))

    def build() -> tuple[dict[str, np.ndarray], dict]:
        print(f"tokenising {source.name} ({part}) into {cache.CACHE_DIR / key} (one process per disk)", flush=True)
        try:
            name, checked = formats.in_format(chosen(), forced, allowed)
        except DataError as error:  # the held-out data's problem is said as such
            raise DataError(f"{flag} {source.name}: {error}" if part != TRAIN else str(error)) from None
        encoded = formats.encode(checked, name, tokenizer, framed=layout == DECODER, workers=tokenising_processes())
        with _said_of_the_fraction(part, fraction, len(encoded.lengths)):
            return packed(encoded, name)

    def packed(encoded, name: str) -> tuple[dict[str, np.ndarray], dict]:
        counts = {}
        if layout == DECODER:
            whole = name != "text"
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            arrays = packing.pack_decoder(encoded, seq_len, whole, truncation, pad or 0)
            counts = {key: int(arrays.pop(key)) for key in ("truncated", "padding")}
            computed = arrays["input_ids"].size
            counts |= {"packing": WHOLE if whole else RUN_ON, "efficiency": (computed - counts["padding"]) / computed}
        else:
            arrays = packing.pack_encoder(encoded, seq_len, tokenizer.cls_token_id, tokenizer.sep_token_id)
        dropped = int(arrays.pop("dropped", 0))
        meta = {
            **counts,
            "part": part,
            "source": source.name,
            "split": split,
            "format": name,
            "records": len(encoded.lengths),
            "tokens": int(len(encoded.ids)),
            "rows": int(arrays["input_ids"].shape[0]),
            "dropped": dropped,
            "seq_len": seq_len,
            "layout": layout,
            "tokenizer": getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__,
        }
        return arrays, meta

    # One process per disk tokenises (checkpoint.py's rule: the main rank, or each host's first where hosts share
    # no filesystem); the others wait for its folder.
    done = cache.tokenized(run_dir.parent, key, build, this_rank_owns_disk(rank))
    return TextData(done.arrays, done)


@contextlib.contextmanager
def _said_of_the_fraction(part: str, fraction: float | None, records: int):
    """Held-out records of --eval-fraction too short to fill one sequence: said of the flag that chose them (the
    launcher knows the record counts, not the tokens)."""
    try:
        yield
    except DataError as error:
        if part != HELD_OUT or not fraction:
            raise
        raise DataError(
            f"--eval-fraction {fraction} holds out {records} record(s) and they pack into nothing to evaluate on "
            f"({error}); give a larger --eval-fraction, a shorter --seq-len, or --eval-data"
        ) from None


def load_held_out(job: Job, run_dir: Path, tokenizer, trained: TextData, rank: int, is_main: bool) -> TextData | None:
    """The rows a text model evaluates on (--eval-data, or the records --eval-fraction holds out), in the format of
    the records it trains on (`trained`) and packed as they are, said on the console by the main rank; None without
    either."""
    if not has_held_out(job):
        return None
    with doing(f"reading held-out data {job.evaluation.data or 'of --eval-fraction'}"):
        data = load(job, run_dir, tokenizer, trained.meta["layout"], rank, HELD_OUT, trained.meta["format"])
    if is_main:
        print(f"held-out {data.said().removeprefix('data: ')}", flush=True)
    return data
