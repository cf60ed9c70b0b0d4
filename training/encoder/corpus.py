"""The text an encoder pretrains on: documents read from a local file or a Hugging Face dataset, or generated
offline; a tokenizer that needs no download; documents packed into fixed-length sequences.

Packing follows RoBERTa's FULL-SENTENCES input (Liu et al. 2019, section 4.2): the corpus's documents, each ended
by [SEP], are laid end to end and cut into pieces of `seq_len - 2` tokens, each framed as `[CLS] piece [SEP]`, so
no position is padding and a piece may cross a document's end. There is no next-sentence objective (the issue's
workload is masked-language modelling only; RoBERTa, section 4.2, found dropping it matched or bettered BERT).
The tail shorter than a piece is dropped. Masks are not drawn here: training/encoder/masking.py draws them per
batch.

Torch-free except `pack`, so the launcher may read and check a corpus without PyTorch.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

from training.common.failure import DataError
from training.common.files import publish_text
from training.llm.dialogues import DAYS, NAMES, PLACES

TEXT_FIELD = "text"
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
"""BERT's special tokens, first in the byte tokenizer's vocabulary (ids 0-4), bytes after them."""


def _text_documents(path: Path) -> Iterator[str]:
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


def _record_text(record: dict, where: str) -> str:
    if TEXT_FIELD not in record:
        raise DataError(f"{where}: record has fields {sorted(record)}; expected {TEXT_FIELD!r}")
    value = record[TEXT_FIELD]
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        raise DataError(f"{where}: field {TEXT_FIELD!r} is {kind}, not text")
    return value


def read_documents(dataset: str, split: str = "train") -> list[str]:
    """Documents from a local `.txt` file (blank-line separated), a JSONL file of {"text": ...} records, or a
    Hugging Face dataset name or local dataset folder with a `text` column. Empty documents are skipped."""
    path = Path(dataset).expanduser()
    if path.is_file() and path.suffix == ".txt":
        documents = list(_text_documents(path))
    elif path.is_file():
        from training.llm.data import jsonl_records

        documents = [_record_text(record, f"line {number}") for number, record in jsonl_records(path)]
    else:
        import datasets  # heavy; only for hub datasets and dataset folders

        rows = datasets.load_dataset(dataset, split=split)
        documents = [_record_text(row, f"row {index}") for index, row in enumerate(rows)]
    documents = [document for document in documents if document.strip()]
    if not documents:
        raise DataError(
            f"--dataset {dataset} holds no text; give documents (blank-line separated in a .txt file, or records with "
            f"a {TEXT_FIELD!r} field)"
        )
    return documents


def make_document(rng: random.Random) -> str:
    """A few sentences about one person whose facts repeat, so a masked name, place or day can be read back from
    the rest of the document (something for a small model to learn)."""
    name, place, day = rng.choice(NAMES), rng.choice(PLACES), rng.choice(DAYS)
    friend = rng.choice([other for other in NAMES if other != name])
    sentences = [
        f"{name} works at {place}.",
        f"Every {day} {name} meets {friend} at {place}.",
        f"{friend} says {name} is never late on {day}.",
        f"After {day} at {place}, {name} and {friend} go home.",
    ]
    rng.shuffle(sentences)
    return " ".join(sentences)


def write_corpus(path: Path, documents: int = 2000, seed: int = 0) -> Path:
    """`documents` generated documents as JSONL {"text": ...} (atomically); the same seed gives the same file."""
    rng = random.Random(seed)
    lines = (json.dumps({TEXT_FIELD: make_document(rng)}) + "\n" for _ in range(documents))
    return publish_text(path, "".join(lines))


def byte_tokenizer():
    """BERT's special tokens, then one token per UTF-8 byte (training/llm/tokenizer.py builds it): saved with a
    model and loaded back by `AutoTokenizer`, no download."""
    from training.llm.tokenizer import byte_tokenizer as bytes_after

    roles = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
    return bytes_after(SPECIAL_TOKENS, **dict(zip(roles, SPECIAL_TOKENS, strict=True)))


def pack(documents: Iterable[list[int]], seq_len: int, cls_id: int, sep_id: int):
    """(sequences, seq_len) int64 tensor of `[CLS] piece [SEP]` rows from tokenised documents (see the module)."""
    import torch

    if seq_len < 3:
        raise DataError(f"--seq-len {seq_len}: an encoder sequence needs at least [CLS], one token and [SEP]")
    stream: list[int] = []
    for ids in documents:
        stream.extend(ids)
        stream.append(sep_id)
    piece = seq_len - 2
    rows = len(stream) // piece
    if rows == 0:
        raise DataError(f"the corpus has {len(stream)} tokens, fewer than one sequence of {seq_len}")
    body = torch.tensor(stream[: rows * piece], dtype=torch.long).view(rows, piece)
    cls = torch.full((rows, 1), cls_id, dtype=torch.long)
    sep = torch.full((rows, 1), sep_id, dtype=torch.long)
    return torch.cat([cls, body, sep], dim=1)
