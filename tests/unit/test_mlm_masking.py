"""Masked-language-model masking (training/encoder/masking.py): BERT's 15% / 80-10-10 rule, drawn per batch and
seeded so a resumed run, or another world size, masks each sequence as the uninterrupted run did."""

from __future__ import annotations

import pytest
import torch

from training.encoder.masking import HELD_OUT_MASKS, IGNORE_INDEX, MaskingRule, mask_tokens

VOCAB, MASK, CLS, SEP, PAD = 1000, 4, 2, 3, 0


def batch(rows: int = 64, length: int = 128, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(10, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))
    ids[:, 0], ids[:, -1], ids[:, -8:-1] = CLS, SEP, PAD  # a sequence's frame and some padding
    special = torch.zeros(VOCAB, dtype=torch.bool)
    special[[PAD, CLS, SEP, MASK]] = True
    return ids, special


def masked(ids, special, step=0, indices=None):
    indices = list(range(len(ids))) if indices is None else indices
    return mask_tokens(ids, indices, seed=7, step=step, special=special, mask_id=MASK, vocab_size=VOCAB)


def test_fifteen_percent_are_predicted_and_of_those_80_10_10():
    ids, special = batch(rows=256)
    inputs, labels = masked(ids, special)
    chosen = labels != IGNORE_INDEX
    ordinary = ~special[ids]
    assert abs(chosen.sum() / ordinary.sum() - 0.15) < 0.01
    assert torch.equal(labels[chosen], ids[chosen])  # the loss predicts the original token
    as_mask = (inputs == MASK) & chosen
    kept = (inputs == ids) & chosen
    changed = chosen & ~as_mask & ~kept
    total = int(chosen.sum())
    assert abs(int(as_mask.sum()) / total - 0.8) < 0.02
    assert abs(int(changed.sum()) / total - 0.1) < 0.02  # a random token (rarely its own: counted as kept)
    assert abs(int(kept.sum()) / total - 0.1) < 0.02
    assert torch.equal(inputs[~chosen], ids[~chosen])  # nothing else changes


def test_special_tokens_are_never_chosen_and_every_sequence_predicts_something():
    ids, special = batch()
    _, labels = masked(ids, special)
    assert not (labels[special[ids]] != IGNORE_INDEX).any()
    short = torch.tensor([[CLS, 50, SEP, PAD, PAD]])
    for step in range(50):  # one ordinary token: chosen at every step, though 15% would usually miss it
        _, labels = masked(short, special, step=step)
        assert labels.tolist() == [[IGNORE_INDEX, 50, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]]


def test_a_sequence_is_masked_by_its_place_in_the_corpus_and_the_step_not_by_its_batch():
    ids, special = batch(rows=8)
    whole_inputs, whole_labels = masked(ids, special, step=3)
    # the same sequences split over two ranks' micro-batches, in another order
    order = [5, 1, 7, 3]
    part_inputs, part_labels = masked(ids[order], special, step=3, indices=order)
    assert torch.equal(part_inputs, whole_inputs[order]) and torch.equal(part_labels, whole_labels[order])
    again, _ = masked(ids, special, step=3)
    assert torch.equal(again, whole_inputs)  # a resumed run draws the same
    later, _ = masked(ids, special, step=4)
    assert not torch.equal(later, whole_inputs)  # a new mask every step: never a cached masked corpus


def test_the_input_batch_is_left_alone():
    ids, special = batch(rows=4)
    before = ids.clone()
    masked(ids, special)
    assert torch.equal(ids, before)


@pytest.mark.parametrize(
    ("rule", "said"),
    [
        (dict(probability=0.0), "give a share between 0 and 1"),
        (dict(replace_with_mask=0.9, replace_with_random=0.2), "add up to at most 1"),
    ],
)
def test_a_rule_outside_its_range_is_refused(rule, said):
    with pytest.raises(ValueError, match=said):
        MaskingRule(**rule)


def test_held_out_sequences_are_masked_the_same_at_every_evaluation_and_unlike_any_training_step():
    """BERT's evaluation masks the held-out sequences for a step no training step has (training/encoder/masking.py
    HELD_OUT_MASKS): two evaluations of the same weights read the same masks, whichever ranks hold the rows."""
    ids, special = batch(rows=8)
    first, labels = masked(ids, special, step=HELD_OUT_MASKS)
    again, again_labels = masked(ids[[6, 2, 4, 0]], special, step=HELD_OUT_MASKS, indices=[6, 2, 4, 0])
    assert torch.equal(again, first[[6, 2, 4, 0]]) and torch.equal(again_labels, labels[[6, 2, 4, 0]])
    assert all(not torch.equal(masked(ids, special, step=step)[0], first) for step in range(0, 20))
