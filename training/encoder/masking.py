"""Masked-language-model inputs, drawn per batch: which tokens a step predicts, and what the model sees there.

The rule is BERT's (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding", section 3.1, "Task #1: Masked LM", and appendix A.1): 15% of the tokens of a sequence are chosen
for prediction; of those, 80% are replaced by [MASK], 10% by a random token and 10% keep their own, so the model
cannot learn that only [MASK] positions matter. Special tokens ([CLS], [SEP], padding) are never chosen. The random
token is drawn from the whole vocabulary, as Hugging Face's DataCollatorForLanguageModeling does.

The masks are drawn when a batch is made, never stored with the data: every pass over the corpus sees new masks
(the "dynamic masking" of Liu et al. 2019, RoBERTa, section 4.1), and no masked copy of the corpus is cached.
They are seeded by (run seed, step, the sequence's index in the corpus): a resumed run draws the masks the
uninterrupted one did, whichever rank and whichever micro-batch a sequence falls in, at any world size.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

IGNORE_INDEX = -100
"""The label of a position the loss skips (torch's cross_entropy default ignore_index)."""
HELD_OUT_MASKS = -1
"""The step the held-out sequences' masks are drawn for (training/encoder/trainer.py evaluate): one no training step
has, the same at every evaluation, so two evaluations of the same weights read the same masks."""


@dataclass(frozen=True)
class MaskingRule:
    probability: float = 0.15
    """Share of a sequence's ordinary tokens chosen for prediction."""
    replace_with_mask: float = 0.8
    """Of the chosen: shown as [MASK]."""
    replace_with_random: float = 0.1
    """Of the chosen: shown as a random token (the rest keep their own)."""

    def __post_init__(self) -> None:
        if not 0 < self.probability < 1:
            raise ValueError(f"masking probability {self.probability}: give a share between 0 and 1")
        if (
            self.replace_with_mask < 0
            or self.replace_with_random < 0
            or self.replace_with_mask + self.replace_with_random > 1
        ):
            raise ValueError("masking: the [MASK] and random shares must be >= 0 and add up to at most 1")


def sequence_seed(seed: int, step: int, index: int) -> int:
    """A 63-bit seed for one sequence's mask at one step (a hash, so neighbouring seeds give unrelated draws)."""
    digest = hashlib.blake2b(f"mlm:{seed}:{step}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def mask_tokens(
    input_ids: torch.Tensor,
    indices: torch.Tensor | list[int],
    *,
    seed: int,
    step: int,
    special: torch.Tensor,
    mask_id: int,
    vocab_size: int,
    rule: MaskingRule = MaskingRule(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) for a batch of token ids (batch, seq_len): `indices` are the sequences' places in the
    corpus, `special` a boolean vector over the vocabulary marking ids that are never chosen. Labels hold the
    original id where the loss predicts and IGNORE_INDEX elsewhere; the input is not modified."""
    inputs, labels = input_ids.clone(), torch.full_like(input_ids, IGNORE_INDEX)
    never = special[input_ids]
    for row, index in enumerate(indices):
        generator = torch.Generator().manual_seed(sequence_seed(seed, step, int(index)))
        draws = torch.rand((3, input_ids.shape[1]), generator=generator)
        chosen = (draws[0] < rule.probability) & ~never[row]
        if not bool(chosen.any()) and not bool(never[row].all()):
            # at least one prediction per sequence (as BERT's data preparation guarantees), or a short sequence
            # would add a row with nothing to learn: the ordinary token with the lowest draw
            chosen[torch.where(never[row], 2.0, draws[0]).argmin()] = True
        labels[row, chosen] = input_ids[row, chosen]
        masked = chosen & (draws[1] < rule.replace_with_mask)
        # The random share is taken from what [MASK] left, so the shares of the chosen are exactly the rule's.
        random_share = rule.replace_with_random / (1 - rule.replace_with_mask) if rule.replace_with_mask < 1 else 0
        randomised = chosen & ~masked & (draws[2] < random_share)
        inputs[row, masked] = mask_id
        count = int(randomised.sum())
        if count:
            inputs[row, randomised] = torch.randint(vocab_size, (count,), generator=generator)
    return inputs, labels
