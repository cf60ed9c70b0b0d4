"""How tokenised examples become fixed-length sequences.

Decoder (`pack_decoder`), blocks of `seq_len` tokens with their labels and per-example position ids (0 at each
example's first token), by format:

- The supervised formats (chat, alpaca, prompt-response, dialogue-summary) pack **whole examples**: best-fit
  decreasing (the longest first, each into the block with the least room that holds it, or a new one), the rest
  of a block padded (pad tokens: no label, positions of their own). An example never continues into another block,
  so a response always sees its prompt. One longer than `seq_len` is cut from the left of its prompt (the first
  token, <bos>, kept; `--truncation left`, the default) when what is trained still fits, else left out; with
  `--truncation drop` it is left out. An example with no trained token is left out. The counts and the packing
  efficiency (example tokens / tokens computed) go into the cache's meta and the run's start line and summary.
- `text` (continued pretraining) runs documents on across blocks, as pretraining does: documents laid end to end,
  cut every `seq_len` tokens, the tail shorter than a block dropped. A block may start mid-document (its positions
  then start past 0).

Either way a token at position 0 (an example's first) is never a target: it would be predicted from the end of
the example before it. A block whose every target is untrained has no loss and no gradient: it is left out and
counted. With `--packing masked` (the default) the trainer passes the position ids to the model, and transformers
reads each restart as an example boundary: its attention mask keeps each example (and the padding) to itself
(`find_packed_sequence_indices` in transformers' masking_utils; flash-attention-2 takes the same ids as
variable-length sequences). With `--packing concat` the position ids are not passed: examples attend across their
boundaries, positions run on; the padding, last in its block, is attended by nothing.

Encoder (`pack_encoder`): RoBERTa's FULL-SENTENCES input (Liu et al. 2019, section 4.2): documents, each ended by
[SEP], laid end to end and cut into pieces of `seq_len - 2` tokens, each framed as `[CLS] piece [SEP]`; a piece may
cross a document's end. No next-sentence objective (RoBERTa found dropping it matched or bettered BERT).
"""

from __future__ import annotations

import bisect

import numpy as np

from training.common.failure import DataError

from .formats import IGNORE_INDEX, Encoded

TRUNCATIONS = ("left", "drop")


def pack_decoder(
    encoded: Encoded, seq_len: int, whole: bool = True, truncation: str = "left", pad_id: int = 0
) -> dict[str, np.ndarray]:
    """{"input_ids", "labels", "position_ids"} arrays of shape (blocks, seq_len), and 0-d counts: "dropped"
    (blocks left out for want of a target, or whole examples left out), "truncated" and "padding" (tokens).
    `whole`: pack whole examples (the supervised formats) rather than run documents on (`text`)."""
    if whole:
        return _pack_whole(encoded, seq_len, truncation, pad_id)
    return _run_on(encoded, seq_len)


def _run_on(encoded: Encoded, seq_len: int) -> dict[str, np.ndarray]:
    ids, labels, lengths = encoded.ids, encoded.labels, encoded.lengths
    blocks = len(ids) // seq_len
    if blocks == 0:
        raise DataError(f"dataset has {len(ids)} tokens, fewer than one sequence of {seq_len}")
    starts = np.cumsum(lengths) - lengths
    positions = np.arange(len(ids), dtype=np.int64) - np.repeat(starts, lengths)
    usable = blocks * seq_len
    targets = np.where(positions[:usable] == 0, IGNORE_INDEX, labels[:usable]).reshape(blocks, seq_len)
    return _kept(ids[:usable].reshape(blocks, seq_len), targets, positions[:usable].reshape(blocks, seq_len), 0, 0)


def _kept(inputs, targets, positions, truncated: int, padding: int, dropped: int = 0) -> dict[str, np.ndarray]:
    """The blocks that hold a target (the loss reads labels[:, 1:]: each position predicts the next token)."""
    keep = (targets[:, 1:] != IGNORE_INDEX).any(axis=1)
    if not keep.any():
        raise DataError(
            f"no block of {inputs.shape[1]} tokens holds a trained token (every one is prompt): use a longer --seq-len"
        )
    return {
        "input_ids": np.ascontiguousarray(inputs[keep].astype(np.int32)),
        "labels": np.ascontiguousarray(targets[keep].astype(np.int32)),
        "position_ids": np.ascontiguousarray(positions[keep].astype(np.int32)),
        "dropped": np.asarray(dropped + len(keep) - int(keep.sum())),
        "truncated": np.asarray(truncated),
        "padding": np.asarray(padding),
    }


def _pack_whole(encoded: Encoded, seq_len: int, truncation: str, pad_id: int) -> dict[str, np.ndarray]:
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation {truncation!r}: one of {TRUNCATIONS}")
    ids, labels = np.asarray(encoded.ids), np.asarray(encoded.labels)
    offsets = np.concatenate([[0], np.cumsum(encoded.lengths)]).astype(np.int64)
    pieces: list[tuple[np.ndarray, np.ndarray]] = []  # each example as it is packed: its ids and labels
    truncated = dropped = 0
    for start, end in zip(offsets[:-1], offsets[1:], strict=True):
        example, targets = ids[start:end], labels[start:end].copy()
        targets[0] = IGNORE_INDEX  # never predicted from the example before
        trained = np.flatnonzero(targets != IGNORE_INDEX)
        cut = len(example) - seq_len
        if not len(trained) or (cut > 0 and (truncation == "drop" or cut >= trained[0])):
            dropped += 1  # nothing to train, or too long even without its prompt
            continue
        if cut > 0:  # the prompt's first tokens after <bos> go
            keep = np.r_[0, cut + 1 : len(example)]
            example, targets, truncated = example[keep], targets[keep], truncated + 1
        pieces.append((example, targets))
    if not pieces:
        raise DataError(
            f"every example is left out at --seq-len {seq_len} ({dropped} too long even without their prompt, with "
            f"--truncation {truncation}, or with no trained token): use a longer --seq-len"
        )
    bins = _best_fit_decreasing([len(example) for example, _ in pieces], seq_len)
    inputs = np.full((len(bins), seq_len), pad_id, dtype=np.int64)
    targets = np.full((len(bins), seq_len), IGNORE_INDEX, dtype=np.int64)
    positions = np.zeros((len(bins), seq_len), dtype=np.int64)
    for row, members in enumerate(bins):
        at = 0
        for index in members:
            example, trained = pieces[index]
            inputs[row, at : at + len(example)], targets[row, at : at + len(example)] = example, trained
            positions[row, at : at + len(example)] = np.arange(len(example))
            at += len(example)
        positions[row, at:] = np.arange(seq_len - at)  # the padding: a sequence of its own
    padding = len(bins) * seq_len - sum(len(example) for example, _ in pieces)
    return _kept(inputs, targets, positions, truncated, padding, dropped)


def _best_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of `lengths` in bins of `capacity`: the longest first (ties in order), each into the bin with the
    least room that holds it, else a new bin."""
    bins: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (free tokens, bin), sorted
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        spot = bisect.bisect_left(room, (lengths[index], -1))
        if spot == len(room):
            bins.append([index])
            free, chosen = capacity - lengths[index], len(bins) - 1
        else:
            free, chosen = room.pop(spot)
            bins[chosen].append(index)
            free -= lengths[index]
        if free:
            bisect.insort(room, (free, chosen))
    return bins


def pack_encoder(encoded: Encoded, seq_len: int, cls_id: int, sep_id: int) -> dict[str, np.ndarray]:
    """{"input_ids"}: (sequences, seq_len) rows of `[CLS] piece [SEP]` (see the module docstring)."""
    if seq_len < 3:
        raise DataError(f"--seq-len {seq_len}: an encoder sequence needs at least [CLS], one token and [SEP]")
    ends = np.cumsum(encoded.lengths)
    stream = np.insert(encoded.ids, ends, sep_id)  # each document ended by [SEP]
    piece = seq_len - 2
    rows = len(stream) // piece
    if rows == 0:
        raise DataError(f"the corpus has {len(stream)} tokens, fewer than one sequence of {seq_len}")
    body = stream[: rows * piece].reshape(rows, piece)
    framed = np.empty((rows, seq_len), dtype=np.int32)
    framed[:, 0], framed[:, 1:-1], framed[:, -1] = cls_id, body, sep_id
    return {"input_ids": framed}
