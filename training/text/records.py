"""Where a text dataset's records come from: local JSONL, JSON or Parquet files, a folder of them, a folder saved with
Hugging Face `datasets` (`save_to_disk`), a plain-text file (an encoder's corpus), or a Hugging Face dataset by name.

Each record comes with where it is (`file:line`, `file: record N`, `row N`), so a bad one is named in the error.
`Source.fingerprint` says whether the data changed (a local file's size and modification time, not its bytes: cheap on
a 100 GB corpus, and a rewritten file always has a new time); a hub dataset is known by its name and split.

Torch-free: the launcher reads and checks a local dataset with it before anything starts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from training.common.failure import DataError

RECORD_SUFFIXES = (".jsonl", ".json", ".parquet")
TEXT_SUFFIX = ".txt"
SAVED_MARKERS = ("state.json", "dataset_dict.json")
"""What `datasets.Dataset.save_to_disk` (one split) and `DatasetDict.save_to_disk` (several) leave in their folder."""


@dataclass(frozen=True)
class Source:
    """A dataset as given (`name`) and what reads it: `files` (local, in order), `saved` (a `save_to_disk` folder)
    or `hub` (a dataset name, read by `datasets.load_dataset`)."""

    name: str
    kind: str
    files: tuple[Path, ...] = ()

    def fingerprint(self, split: str) -> str:
        """Changes when the data does: each local file's path, size and modification time; a hub name and split."""
        if self.kind == "hub":
            parts = [f"hub:{self.name}:{split}"]
        else:
            parts = [f"{self.kind}:{split}"]
            folder = Path(self.name).expanduser()
            files = self.files or tuple(sorted(p for p in folder.rglob("*") if p.is_file()))
            for path in files:
                stat = path.stat()
                parts.append(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]

    def records(self, split: str = "train") -> Iterator[tuple[str, dict]]:
        """(where, record) for every record, in order."""
        if self.kind == "files":
            for path in self.files:
                yield from _file_records(path)
            return
        import datasets  # heavy; only for saved folders and hub names

        if self.kind == "saved":
            loaded = datasets.load_from_disk(str(Path(self.name).expanduser()))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise DataError(
                        f"--dataset {self.name} has splits {sorted(loaded)}, not {split!r}: give --dataset-split"
                    )
                loaded = loaded[split]
        else:
            loaded = datasets.load_dataset(self.name, split=split)
        for index, row in enumerate(loaded):
            yield f"row {index}", row


def resolve(dataset: str, flag: str = "--dataset") -> Source:
    """The source `--dataset` (or `flag`) names: an existing file or folder, else a hub name."""
    path = Path(dataset).expanduser()
    if path.is_file():
        if path.suffix not in (*RECORD_SUFFIXES, TEXT_SUFFIX):
            raise DataError(f"{flag} {dataset}: a {path.suffix or 'suffix-less'} file; {_accepted()}")
        return Source(dataset, "files", (path,))
    if path.is_dir():
        if any((path / marker).is_file() for marker in SAVED_MARKERS):
            return Source(dataset, "saved")
        files = tuple(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (*RECORD_SUFFIXES, TEXT_SUFFIX)))
        if not files:
            raise DataError(f"{flag} {dataset} is a folder with no data files; {_accepted()}")
        return Source(dataset, "files", files)
    return Source(dataset, "hub")


def _accepted() -> str:
    return (
        "give .jsonl, .json or .parquet files (an encoder also reads .txt), a folder of them, a folder saved with "
        "`datasets`, or a Hugging Face dataset name"
    )


def _file_records(path: Path) -> Iterator[tuple[str, dict]]:
    if path.suffix == ".jsonl":
        yield from jsonl_records(path)
    elif path.suffix == ".json":
        yield from _json_records(path)
    elif path.suffix == ".parquet":
        yield from _parquet_records(path)
    else:
        for index, document in enumerate(text_documents(path), start=1):
            yield f"{path}: document {index}", {"text": document}


def jsonl_records(path: Path) -> Iterator[tuple[str, dict]]:
    """(`file:line`, record) for each non-blank line; a line that is not a JSON object is a DataError naming it."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(f"{where}: {error}") from None
            yield where, _object(record, where)


def _json_records(path: Path) -> Iterator[tuple[str, dict]]:
    """A JSON file holding a list of records (or JSON Lines under a .json name, as `datasets` reads both)."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        yield from jsonl_records(path)  # JSON Lines named .json
        return
    if isinstance(data, dict):  # one record (JSON Lines of one line)
        data = [data]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a list of records, found {type(data).__name__}")
    for index, record in enumerate(data, start=1):
        where = f"{path}: record {index}"
        yield where, _object(record, where)


def _parquet_records(path: Path) -> Iterator[tuple[str, dict]]:
    import pyarrow.parquet as pq  # installed with `datasets`

    parquet = pq.ParquetFile(path)
    index = 0
    for batch in parquet.iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            index += 1
            yield f"{path}: row {index}", row


def _object(record, where: str) -> dict:
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, found {type(record).__name__}")
    return record


def text_documents(path: Path) -> Iterator[str]:
    """A plain text file: documents separated by a blank line (the layout of BERT's pretraining text files)."""
    document: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                document.append(line.strip())
            elif document:
                yield " ".join(document)
                document = []
    if document:
        yield " ".join(document)
