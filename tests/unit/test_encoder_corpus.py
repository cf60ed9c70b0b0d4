"""The encoder's corpus (training/encoder/corpus.py): documents from text and JSONL files, the generated corpus,
the byte tokenizer with BERT's special tokens, and packing into [CLS] ... [SEP] sequences."""

from __future__ import annotations

import json

import pytest

from training.encoder.corpus import SPECIAL_TOKENS, byte_tokenizer, write_corpus
from training.text import records


def test_the_generated_corpus_is_the_same_for_the_same_seed(tmp_path):
    first = write_corpus(tmp_path / "a.jsonl", documents=50, seed=3).read_bytes()
    assert write_corpus(tmp_path / "b.jsonl", documents=50, seed=3).read_bytes() == first
    assert write_corpus(tmp_path / "c.jsonl", documents=50, seed=4).read_bytes() != first
    documents = [record["text"] for _where, record in records.resolve(str(tmp_path / "a.jsonl")).records()]
    assert len(documents) == 50 and all(document.count(".") == 4 for document in documents)


def test_the_byte_tokenizer_puts_berts_special_tokens_first_and_round_trips_text():
    tokenizer = byte_tokenizer()
    assert [tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id) == (
        0,
        2,
        3,
        4,
    )
    assert len(tokenizer) == len(SPECIAL_TOKENS) + 256
    text = "Hana works at the café."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode()) and min(ids) >= len(SPECIAL_TOKENS)
    assert tokenizer.decode(ids) == text


def test_the_launcher_refuses_a_bad_or_missing_local_corpus_in_one_line(tmp_path):
    from training.spec import Job
    from trainkit.errors import SpecError
    from trainkit.run.prepare import _check_text, _local_dataset

    job = Job()
    job.model.family = "bert"
    binary = tmp_path / "corpus.txt"
    binary.write_bytes(b"caf\xe9 au lait\n")
    with pytest.raises(SpecError, match=r"corpus.txt is not UTF-8 text \(invalid continuation byte at byte 3\)"):
        _check_text(job, binary)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(SpecError, match=r"^--dataset .*empty.txt holds no records; give one record per line"):
        _check_text(job, empty)
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "assistant", "content": "x"}]}) + "\n")
    with pytest.raises(SpecError, match=r"chat.jsonl:1: records are chat, and this model reads text \('text'\)"):
        _check_text(job, chat)
    job.data.dataset = "data/corpus.txt"  # looks like owner/name, but is a file's name
    with pytest.raises(SpecError, match="does not exist; give a JSONL, JSON, Parquet or text file, a dataset name"):
        _local_dataset(job)
