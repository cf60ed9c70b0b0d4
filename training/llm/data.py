"""Instruction data: load, format (prompt + response), tokenise, pack, and shard across ranks.

Loss is taken on response tokens only: prompt tokens get label -100. Examples are concatenated and
cut into `seq_len` blocks (packing); attention is not masked at example boundaries, the usual
trade for packed fine-tuning. The order of blocks is a seeded permutation per epoch and each
optimizer step reads a fixed slice of it, so the data position is the step number and a resumed
run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from training.common.failure import DataError

IGNORE_INDEX = -100
PROMPT_TEMPLATE = "Summarize the following dialogue.\n\n{dialogue}\n\nSummary:\n"


def jsonl_records(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) for each non-blank line; a line that is not a JSON object is a ValueError
    that names it."""
    with path.open() as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(f"line {number}: {error}") from None
            if not isinstance(record, dict):
                raise DataError(f"line {number}: expected a JSON object, found {type(record).__name__}")
            yield number, record


def check_records(path: Path) -> int:
    """How many records a local JSONL file holds, each with the fields training reads (else ValueError)."""
    count = 0
    for number, record in jsonl_records(path):
        try:
            to_prompt_response(record)
        except ValueError as error:
            raise DataError(f"line {number}: {error}") from None
        count += 1
    return count


def load_records(dataset: str, split: str = "train") -> list[dict]:
    """Records from a local JSONL file, or from a Hugging Face dataset name or local dataset directory."""
    path = Path(dataset)
    if path.is_file():
        return [record for _number, record in jsonl_records(path)]
    import datasets  # heavy; only needed for hub datasets and dataset directories

    return list(datasets.load_dataset(dataset, split=split))


def _texts(record: dict, first: str, second: str) -> tuple[str, str]:
    """The two fields as text; a field of another type (a number, a list, null) is a DataError naming it."""
    for name in (first, second):
        value = record[name]
        if not isinstance(value, str):
            kind = "null" if value is None else type(value).__name__
            shown = json.dumps(value)[:40]
            raise DataError(f"field {name!r} is {kind} ({shown}), not text")
    return record[first], record[second]


def to_prompt_response(record: dict) -> tuple[str, str]:
    """Accept `prompt`/`response` records, or DialogSum/SAMSum style `dialogue`/`summary` records, each field text."""
    if "prompt" in record and "response" in record:
        return _texts(record, "prompt", "response")
    if "dialogue" in record and "summary" in record:
        dialogue, summary = _texts(record, "dialogue", "summary")
        return PROMPT_TEMPLATE.format(dialogue=dialogue.strip()), summary.strip()
    raise DataError(
        f"dataset record has fields {sorted(record)}; expected 'prompt' and 'response', or 'dialogue' and 'summary'"
    )


def tokenize_examples(records: Iterable[dict], tokenizer) -> tuple[list[int], list[int]]:
    """One long token stream and its labels: <s> prompt response </s>, loss on response and </s>."""
    ids: list[int] = []
    labels: list[int] = []
    for number, record in enumerate(records, start=1):
        try:
            prompt, response = to_prompt_response(record)
        except DataError as error:
            raise DataError(f"record {number}: {error}") from None
        prompt_ids = [tokenizer.bos_token_id] + tokenizer(prompt, add_special_tokens=False)["input_ids"]
        response_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids.extend(prompt_ids + response_ids)
        labels.extend([IGNORE_INDEX] * len(prompt_ids) + response_ids)
    return ids, labels


@dataclass
class PackedDataset:
    """Fixed-length blocks of input ids and labels. A block whose every target is a prompt token
    (possible when --seq-len is shorter than a prompt) has no loss and no gradient: it is left out
    rather than trained on for nothing, and counted in `dropped`."""

    input_ids: torch.Tensor  # (blocks, seq_len) int64
    labels: torch.Tensor  # (blocks, seq_len) int64
    dropped: int = 0

    @classmethod
    def pack(cls, ids: list[int], labels: list[int], seq_len: int) -> PackedDataset:
        blocks = len(ids) // seq_len
        if blocks == 0:
            raise DataError(f"dataset has {len(ids)} tokens, fewer than one sequence of {seq_len}")
        usable = blocks * seq_len
        input_ids = torch.tensor(ids[:usable], dtype=torch.long).view(blocks, seq_len)
        targets = torch.tensor(labels[:usable], dtype=torch.long).view(blocks, seq_len)
        # The loss reads labels[:, 1:] (each position predicts the next token).
        keep = (targets[:, 1:] != IGNORE_INDEX).any(dim=1)
        if not bool(keep.any()):
            raise DataError(
                f"no block of {seq_len} tokens holds a response token (every one is prompt): use a longer --seq-len"
            )
        return cls(input_ids=input_ids[keep], labels=targets[keep], dropped=blocks - int(keep.sum()))

    def __len__(self) -> int:
        return self.input_ids.shape[0]
