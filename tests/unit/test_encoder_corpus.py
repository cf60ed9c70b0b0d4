"""The encoder's corpus (training/encoder/corpus.py): documents from text and JSONL files, the generated corpus,
the byte tokenizer with BERT's special tokens, and packing into [CLS] ... [SEP] sequences."""

from __future__ import annotations

import json

import pytest

from training.common.failure import DataError
from training.encoder.corpus import SPECIAL_TOKENS, byte_tokenizer, pack, read_documents, write_corpus


def test_a_text_file_holds_one_document_per_blank_line_separated_block(tmp_path):
    path = tmp_path / "wiki.txt"
    path.write_text("First line of one.\nIts second line.\n\n\nAnother document.\n\n")
    assert read_documents(str(path)) == ["First line of one. Its second line.", "Another document."]


def test_jsonl_records_give_their_text_and_a_bad_record_is_named(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"text": "one"}) + "\n" + json.dumps({"text": ""}) + "\n" + json.dumps({"text": "two"}))
    assert read_documents(str(path)) == ["one", "two"]  # an empty document is skipped
    path.write_text(json.dumps({"text": "one"}) + "\n" + json.dumps({"body": "x", "id": 3}) + "\n")
    with pytest.raises(DataError, match=r"line 2: record has fields \['body', 'id'\]; expected 'text'"):
        read_documents(str(path))
    path.write_text(json.dumps({"text": ["a", "list"]}) + "\n")
    with pytest.raises(DataError, match="line 1: field 'text' is list, not text"):
        read_documents(str(path))
    path.write_text("\n")
    with pytest.raises(DataError, match="holds no text"):
        read_documents(str(path))


def test_the_generated_corpus_is_the_same_for_the_same_seed(tmp_path):
    first = write_corpus(tmp_path / "a.jsonl", documents=50, seed=3).read_bytes()
    assert write_corpus(tmp_path / "b.jsonl", documents=50, seed=3).read_bytes() == first
    assert write_corpus(tmp_path / "c.jsonl", documents=50, seed=4).read_bytes() != first
    documents = read_documents(str(tmp_path / "a.jsonl"))
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


def test_documents_are_packed_end_to_end_into_framed_sequences():
    rows = pack([[10, 11, 12], [20, 21], [30, 31, 32, 33]], seq_len=6, cls_id=2, sep_id=3)
    # the stream: 10 11 12 3 20 21 3 30 31 32 33 3 -> pieces of 4, the tail of 0 dropped
    assert rows.tolist() == [[2, 10, 11, 12, 3, 3], [2, 20, 21, 3, 30, 3], [2, 31, 32, 33, 3, 3]]
    with pytest.raises(DataError, match="fewer than one sequence of 128"):
        pack([[10, 11]], seq_len=128, cls_id=2, sep_id=3)
    with pytest.raises(DataError, match="needs at least"):
        pack([[10, 11]], seq_len=2, cls_id=2, sep_id=3)


def test_the_launcher_refuses_a_bad_or_missing_local_corpus_in_one_line(tmp_path):
    from training.common.job import Job
    from trainkit.errors import SpecError
    from trainkit.run.prepare import _check_corpus, _local_dataset

    binary = tmp_path / "corpus.txt"
    binary.write_bytes(b"caf\xe9 au lait\n")
    with pytest.raises(SpecError, match=r"corpus.txt is not UTF-8 text \(invalid continuation byte at byte 3\)"):
        _check_corpus(binary)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(SpecError, match=r"^--dataset .*empty.txt holds no text; give documents \(blank-line"):
        _check_corpus(empty)
    job = Job()
    job.model.family, job.data.dataset = "bert", "data/corpus.txt"  # looks like owner/name, but is a file's name
    with pytest.raises(SpecError, match="does not exist; give a JSONL or text file, a dataset name or 'synthetic'"):
        _local_dataset(job)
