"""--eval-fraction's records (training/text/holdout.py): whole records, a fixed count, the same choice every time a
run asks, and refused with the counts when nothing would be held out or left to train on."""

from __future__ import annotations

import numpy as np
import pytest

from training.common.failure import DataError
from training.text.holdout import held_out_records


def test_the_fraction_holds_out_that_many_whole_records_the_same_ones_every_time():
    chosen = held_out_records(2000, 0.1, seed=1234)
    assert len(chosen) == 200 and len(set(chosen.tolist())) == 200 and list(chosen) == sorted(chosen)
    assert np.array_equal(chosen, held_out_records(2000, 0.1, seed=1234))  # every rank, every restart
    assert not np.array_equal(chosen, held_out_records(2000, 0.1, seed=1235))  # the run's seed chooses
    assert 0 <= chosen.min() and chosen.max() < 2000


def test_choosing_them_moves_no_random_state_the_training_draws_from():
    import torch

    np.random.seed(7)
    torch.manual_seed(7)
    before = np.random.random(), torch.rand(1).item()
    np.random.seed(7)
    torch.manual_seed(7)
    held_out_records(500, 0.2, seed=3)
    assert (np.random.random(), torch.rand(1).item()) == before


@pytest.mark.parametrize(
    ("count", "fraction", "said"),
    [
        (4, 0.1, "--eval-fraction 0.1 of 4 records holds out 0 and leaves no record to evaluate on"),
        (3, 0.9, "--eval-fraction 0.9 of 3 records holds out 3 and leaves no record to train on"),
    ],
)
def test_a_fraction_that_holds_out_none_or_all_is_refused_with_the_counts(count, fraction, said):
    with pytest.raises(DataError, match=said):
        held_out_records(count, fraction, seed=1)


def test_sagemaker_reads_the_evaluation_figures_of_a_job_that_has_held_out_data():
    from training.spec import Job
    from trainkit.backends.sagemaker.request import metric_definitions

    job = Job()
    job.model.name = "llama2-tiny"
    assert [d["Name"] for d in metric_definitions(job)] == ["loss", "tokens_per_s"]
    job.evaluation.fraction = 0.1
    assert [d["Name"] for d in metric_definitions(job)] == ["loss", "tokens_per_s", "eval_loss", "eval_ppl"]


def test_the_best_so_far_follows_every_improvement_and_patience_counts_only_real_ones():
    from training.common.best import BestSoFar

    best = BestSoFar("eval_loss", lower_is_better=True, delta=0.05)
    offers = [(3, 2.0), (6, 1.9), (9, 1.88), (12, 1.87), (15, 1.95)]
    kept = [best.offer(step, {"eval_loss": value}) for step, value in offers]
    # 1.88 and 1.87 are better (kept as the best) but not by more than 0.05: they do not reset the patience count
    assert kept == [True, True, True, True, False] and (best.step, best.value, best.stale) == (12, 1.87, 3)
    again = BestSoFar("eval_loss", lower_is_better=True, delta=0.05)
    again.restore(best.state())  # what a resumed run judges from
    assert (again.step, again.value, again.stale) == (12, 1.87, 3)
    top1 = BestSoFar("val_top1", lower_is_better=False)
    assert [top1.offer(s, {"val_top1": v}) for s, v in ((1, 0.2), (2, 0.5), (3, 0.5))] == [True, True, False]
    assert (top1.step, top1.stale) == (2, 1)


def test_held_out_data_is_refused_when_it_is_the_training_data_by_another_name(tmp_path, monkeypatch):
    from training.spec import Job
    from trainkit.errors import SpecError
    from trainkit.job.held_out import validate_evaluation

    (tmp_path / "a.jsonl").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    job = Job()
    job.data.dataset, job.evaluation.data = "a.jsonl", f"{tmp_path}/./a.jsonl"
    with pytest.raises(SpecError, match="is the training data"):
        validate_evaluation(job, text=True)
    job.data.dataset, job.data.dataset_split, job.evaluation.data = "org/chats", "train", "org/chats"
    validate_evaluation(job, text=True)  # the hub dataset's validation split: other records
    job.evaluation.split = "train"
    with pytest.raises(SpecError, match="is the training data"):
        validate_evaluation(job, text=True)


def test_held_out_records_too_short_for_one_sequence_are_said_of_the_fraction(tmp_path):
    """The launcher checks record counts; tokens are known once the workers tokenise, and then the refusal names the
    flag that chose the records, not only the packer's count."""
    import json

    from training.spec import Job
    from training.text.dataset import DECODER, HELD_OUT, TRAIN, load
    from training.text.tokenizer import byte_tokenizer

    records = [{"text": f"record {i}: " + "a short line. " * 4} for i in range(40)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    job = Job()
    job.model.name, job.data.dataset, job.data.seq_len, job.evaluation.fraction = "llama2-tiny", "t.jsonl", 256, 0.05
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    job.data.dataset = str(tmp_path / "t.jsonl")
    trained = load(job, run, byte_tokenizer(), DECODER, rank=0, part=TRAIN)
    assert trained.meta["records"] == 38
    with pytest.raises(
        DataError,
        match=r"--eval-fraction 0.05 holds out 2 record\(s\) and they pack into nothing .*"
        r"fewer than one sequence of 256.*a larger --eval-fraction, a shorter --seq-len",
    ):
        load(job, run, byte_tokenizer(), DECODER, rank=0, part=HELD_OUT)
