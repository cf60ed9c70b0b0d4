"""Instruction data: load, format (prompt + response), tokenise, pack, and shard across ranks.

Loss is taken on response tokens only: prompt tokens get label -100. Examples are concatenated and
cut into `seq_len` blocks (packing); attention is not masked at example boundaries, the usual
trade for packed fine-tuning. The order of blocks is a seeded permutation per epoch and each
optimizer step reads a fixed slice of it, so the data position is the step number and a resumed
run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

IGNORE_INDEX = -100
PROMPT_TEMPLATE = "Summarize the following dialogue.\n\n{dialogue}\n\nSummary:\n"


def load_records(dataset: str, split: str = "train") -> list[dict]:
    """Records from a local JSONL file, or from a Hugging Face dataset name or local dataset directory."""
    path = Path(dataset)
    if path.is_file():
        with path.open() as handle:
            return [json.loads(line) for line in handle if line.strip()]
    import datasets  # heavy; only needed for hub datasets and dataset directories

    return list(datasets.load_dataset(dataset, split=split))


def to_prompt_response(record: dict) -> tuple[str, str]:
    """Accept `prompt`/`response` records, or DialogSum/SAMSum style `dialogue`/`summary` records."""
    if "prompt" in record and "response" in record:
        return record["prompt"], record["response"]
    if "dialogue" in record and "summary" in record:
        return PROMPT_TEMPLATE.format(dialogue=record["dialogue"].strip()), record["summary"].strip()
    raise ValueError(
        f"dataset record has fields {sorted(record)}; expected 'prompt' and 'response', or 'dialogue' and 'summary'"
    )


def tokenize_examples(records: Iterable[dict], tokenizer) -> tuple[list[int], list[int]]:
    """One long token stream and its labels: <s> prompt response </s>, loss on response and </s>."""
    ids: list[int] = []
    labels: list[int] = []
    for record in records:
        prompt, response = to_prompt_response(record)
        prompt_ids = [tokenizer.bos_token_id] + tokenizer(prompt, add_special_tokens=False)["input_ids"]
        response_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids.extend(prompt_ids + response_ids)
        labels.extend([IGNORE_INDEX] * len(prompt_ids) + response_ids)
    return ids, labels


@dataclass
class PackedDataset:
    """Fixed-length blocks of input ids and labels."""

    input_ids: torch.Tensor  # (blocks, seq_len) int64
    labels: torch.Tensor  # (blocks, seq_len) int64

    @classmethod
    def pack(cls, ids: list[int], labels: list[int], seq_len: int) -> PackedDataset:
        blocks = len(ids) // seq_len
        if blocks == 0:
            raise ValueError(f"dataset has {len(ids)} tokens, fewer than one sequence of {seq_len}")
        usable = blocks * seq_len
        return cls(
            input_ids=torch.tensor(ids[:usable], dtype=torch.long).view(blocks, seq_len),
            labels=torch.tensor(labels[:usable], dtype=torch.long).view(blocks, seq_len),
        )

    def __len__(self) -> int:
        return self.input_ids.shape[0]


class StepSampler:
    """Which blocks each rank reads at each optimizer step: a pure function of (seed, step).

    Epoch e uses permutation(seed + e); step s reads global positions [s*G, (s+1)*G) of the epoch,
    rank r takes the r-th contiguous slice of G/world, split into micro batches.
    """

    def __init__(self, num_blocks: int, global_batch: int, micro_batch: int, rank: int, world: int, seed: int):
        if num_blocks < global_batch:
            raise ValueError(
                f"dataset packs into {num_blocks} sequences, fewer than one global batch of {global_batch}; "
                "use more data, a smaller --global-batch-size or a shorter --seq-len"
            )
        self.num_blocks, self.global_batch, self.micro_batch = num_blocks, global_batch, micro_batch
        self.rank, self.world, self.seed = rank, world, seed
        self.steps_per_epoch = num_blocks // global_batch
        self._cached_epoch = -1
        self._order = torch.empty(0, dtype=torch.long)

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._cached_epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._order = torch.randperm(self.num_blocks, generator=generator)
            self._cached_epoch = epoch
        return self._order

    def micro_batches(self, step: int) -> list[torch.Tensor]:
        """Block indices for each micro batch this rank runs at `step` (0-based)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        order = self._permutation(epoch)
        per_rank = self.global_batch // self.world
        start = within * self.global_batch + self.rank * per_rank
        mine = order[start : start + per_rank]
        return list(mine.split(self.micro_batch))
