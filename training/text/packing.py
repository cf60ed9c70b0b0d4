"""Examples laid end to end and cut into fixed-length sequences, with no padding.

Decoder (`pack_decoder`): blocks of `seq_len` tokens with their labels and per-example position ids (0 at each
example's first token). A block whose every target is untrained (possible when --seq-len is shorter than a prompt)
has no loss and no gradient: it is left out and counted. The tail shorter than a block is dropped. With
`--packing masked` (the default) the trainer passes the position ids to the model, and transformers reads each
restart as an example boundary: its attention mask keeps each example to itself (`find_packed_sequence_indices`
in transformers' masking_utils; flash-attention-2 takes the same ids as variable-length sequences). With
`--packing concat` the position ids are not passed: examples attend across their boundaries, positions run on.

Encoder (`pack_encoder`): RoBERTa's FULL-SENTENCES input (Liu et al. 2019, section 4.2): documents, each ended by
[SEP], laid end to end and cut into pieces of `seq_len - 2` tokens, each framed as `[CLS] piece [SEP]`; a piece may
cross a document's end. No next-sentence objective (RoBERTa found dropping it matched or bettered BERT).
"""

from __future__ import annotations

import numpy as np

from training.common.failure import DataError

from .formats import IGNORE_INDEX, Encoded


def pack_decoder(encoded: Encoded, seq_len: int) -> dict[str, np.ndarray]:
    """{"input_ids", "labels", "position_ids"} arrays of shape (blocks, seq_len), and "dropped" (a 0-d count)."""
    ids, labels, lengths = encoded.ids, encoded.labels, encoded.lengths
    blocks = len(ids) // seq_len
    if blocks == 0:
        raise DataError(f"dataset has {len(ids)} tokens, fewer than one sequence of {seq_len}")
    starts = np.cumsum(lengths) - lengths
    positions = np.arange(len(ids), dtype=np.int64) - np.repeat(starts, lengths)
    usable = blocks * seq_len
    inputs = ids[:usable].reshape(blocks, seq_len)
    targets = labels[:usable].reshape(blocks, seq_len)
    # The loss reads labels[:, 1:] (each position predicts the next token).
    keep = (targets[:, 1:] != IGNORE_INDEX).any(axis=1)
    if not keep.any():
        raise DataError(
            f"no block of {seq_len} tokens holds a trained token (every one is prompt): use a longer --seq-len"
        )
    return {
        "input_ids": np.ascontiguousarray(inputs[keep]),
        "labels": np.ascontiguousarray(targets[keep]),
        "position_ids": np.ascontiguousarray(positions[:usable].reshape(blocks, seq_len)[keep].astype(np.int32)),
        "dropped": np.asarray(blocks - int(keep.sum())),
    }


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
