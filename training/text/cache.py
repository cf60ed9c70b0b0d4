"""Tokenise once: a dataset's packed sequences, made by one process and memory-mapped by every rank.

The cache lives under `<runs-dir>/.cache/tokenized/<key>/`, the key a hash of what decides its contents: the data's
fingerprint (records.py), the split, the tokenizer (its whole serialised form and chat template), the format asked
for, the sequence length, the layout (decoder blocks or encoder rows) and the truncation of over-long examples. A
resumed run, and any other run on the same data with the same tokenizer and length, maps the same folder; a changed
file, tokenizer or --seq-len makes a new one.

One process per disk builds it (the main rank; each host's first rank where hosts share no filesystem:
training/common/checkpoint.py's `owns_disk`), into `.tmp-<key>-<pid>/`, published by renaming the folder, whose
`meta.json` is written last inside it; the other ranks wait for the folder (no collective: tokenising a large
dataset may take longer than a collective's timeout, and a builder that fails ends the job through its agent).
Two runs building the same key at once both finish; the first rename wins and the other copy is removed.
Arrays are `.npy` files (int32), read with `numpy.load(mmap_mode="r")`: each rank's pages come from the page cache,
shared, and only the rows it reads are touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .records import Source

CACHE_DIR = Path(".cache") / "tokenized"
LAYOUT_VERSION = 2
"""Bump when what a cache folder holds changes meaning: older folders are then never read."""
META = "meta.json"
POLL_S = 0.1


def tokenizer_fingerprint(tokenizer) -> str:
    """Changes when the tokenizer would give other ids: its fast tokenizer's full JSON, special tokens, template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    parts = [
        type(tokenizer).__name__,
        backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True),
        json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str),
        tokenizer.chat_template or "",
    ]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


def cache_key(
    source: Source,
    split: str,
    tokenizer,
    data_format: str | None,
    seq_len: int,
    layout: str,
    truncation: str = "left",
    holdout: dict | None = None,
) -> str:
    """What a cache folder holds, hashed; `holdout`: the side of an --eval-fraction split (a key of its own; none
    keeps the key a dataset had before held-out data existed)."""
    what = {
        "truncation": truncation,
        "version": LAYOUT_VERSION,
        "data": source.fingerprint(split),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "format": data_format or "detected",
        "seq_len": seq_len,
        "layout": layout,
    } | ({"holdout": holdout} if holdout else {})
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]


@dataclass
class Tokenized:
    """A cache folder's arrays (memory-mapped), what its meta.json says, and whether this process built it."""

    folder: Path
    arrays: dict[str, np.ndarray]
    meta: dict
    built: bool
    seconds: float


def tokenized(
    runs_dir: Path, key: str, build: Callable[[], tuple[dict[str, np.ndarray], dict]], builds_here: bool
) -> Tokenized:
    """The cache folder for `key` under `runs_dir`, built here by `build` (arrays, meta) if this process builds it
    and it is missing; else waited for."""
    folder = Path(runs_dir) / CACHE_DIR / key
    started = time.perf_counter()
    built = False
    if not (folder / META).is_file():
        if builds_here:
            _build(folder, build)
            built = True
        else:
            while not (folder / META).is_file():
                time.sleep(POLL_S)
    meta = json.loads((folder / META).read_text())
    arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in meta["arrays"]}
    return Tokenized(folder, arrays, meta, built, time.perf_counter() - started)


def _build(folder: Path, build: Callable[[], tuple[dict[str, np.ndarray], dict]]) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".tmp-{folder.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        started = time.perf_counter()
        arrays, meta = build()
        for name, array in arrays.items():
            np.save(tmp / f"{name}.npy", array)
        meta = {**meta, "arrays": sorted(arrays), "seconds": round(time.perf_counter() - started, 3)}
        (tmp / META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        _sync(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another run published the same key first: theirs is the same data
            if not (folder / META).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _sync(folder: Path) -> None:
    """Data on disk before the folder is published (a crash after the rename leaves whole files)."""
    for path in folder.iterdir():
        with path.open("rb") as handle:
            os.fsync(handle.fileno())
