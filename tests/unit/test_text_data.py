"""The shared text path (training/text): records from every kind of source, each format's tokens and loss mask,
format detection and its refusals, packing for decoders and encoders, and the tokenise-once cache's keys."""

from __future__ import annotations

import json

import numpy as np
import pytest

from training.common.failure import DataError
from training.encoder.corpus import byte_tokenizer as bert_tokenizer
from training.spec import DATA_FORMATS
from training.text import cache, formats, packing, records
from training.text.formats import IGNORE_INDEX
from training.text.tokenizer import load_tokenizer

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi?"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye?"},
    {"role": "assistant", "content": "Bye."},
]

# A Llama-3-shaped template written for this test (header, content, end-of-turn marker), with no generation markers.
HEADER_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|h|>' + m['role'] + '<|/h|>\n' + m['content'] + '<|eot|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|h|>assistant<|/h|>\n' }}{% endif %}"
)
# The same with {% generation %} markers around the assistant's content and end marker.
MARKED_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}{{ '<|h|>assistant<|/h|>\n' }}"
    "{% generation %}{{ m['content'] + '<|eot|>' }}{% endgeneration %}{% else %}"
    "{{ '<|h|>' + m['role'] + '<|/h|>\n' + m['content'] + '<|eot|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|h|>assistant<|/h|>\n' }}{% endif %}"
)


def trained_text(name: str, record: dict, tokenizer) -> tuple[str, str]:
    """(the whole example, the concatenation of its trained tokens) as text."""
    encoded = formats.encode([("test", record)], name, tokenizer)
    ids, labels = encoded.ids.tolist(), encoded.labels.tolist()
    kept = [token for token in labels if token != IGNORE_INDEX]
    return tokenizer.decode(ids), tokenizer.decode(kept)


def test_the_job_model_offers_exactly_the_formats_the_data_path_reads():
    assert formats.FORMAT_NAMES == DATA_FORMATS


def test_pair_formats_train_the_response_and_eos_only():
    tokenizer = load_tokenizer("byte")
    whole, trained = trained_text("prompt-response", {"prompt": "Q?", "response": "A."}, tokenizer)
    assert (whole, trained) == ("<s>Q?A.</s>", "A.</s>")
    whole, trained = trained_text("dialogue-summary", {"dialogue": " #P1#: hi ", "summary": " They greet. "}, tokenizer)
    assert whole == "<s>" + formats.DIALOGUE_PROMPT.format(dialogue="#P1#: hi") + "They greet.</s>"
    assert trained == "They greet.</s>"
    whole, trained = trained_text("alpaca", {"instruction": "Add.", "input": "2, 3", "output": "5"}, tokenizer)
    assert whole == "<s>### Instruction:\nAdd.\n\n### Input:\n2, 3\n\n### Response:\n5</s>" and trained == "5</s>"
    for empty in ({"input": ""}, {"input": None}, {}):
        whole, trained = trained_text("alpaca", {"instruction": "Greet.", "output": "Hi", **empty}, tokenizer)
        assert whole == "<s>### Instruction:\nGreet.\n\n### Response:\nHi</s>" and trained == "Hi</s>"


def test_text_trains_every_token():
    tokenizer = load_tokenizer("byte")
    encoded = formats.encode([("a", {"text": "abc"})], "text", tokenizer)
    assert encoded.ids.tolist() == encoded.labels.tolist() and tokenizer.decode(encoded.ids.tolist()) == "<s>abc</s>"


@pytest.mark.parametrize("template", [None, HEADER_TEMPLATE, MARKED_TEMPLATE], ids=["default", "plain", "marked"])
def test_multi_turn_chat_trains_each_assistant_turn_with_its_end_and_nothing_else(template):
    tokenizer = load_tokenizer("byte")
    if template:
        tokenizer.chat_template = template
    encoded = formats.encode([("a", {"messages": CHAT})], "chat", tokenizer)
    ids, labels = encoded.ids.tolist(), encoded.labels.tolist()
    trained_runs, run = [], []
    for token, label in zip(ids, labels, strict=True):
        assert label in (IGNORE_INDEX, token)
        if label == token:
            run.append(token)
        elif run:
            trained_runs.append(tokenizer.decode(run))
            run = []
    if run:
        trained_runs.append(tokenizer.decode(run))
    if template is None:  # ChatML markers, each assistant turn ended by </s>
        assert trained_runs == ["Hello.<|im_end|>\n</s>", "Bye.<|im_end|>\n</s>"]
        assert tokenizer.decode(ids).startswith("<s><|im_start|>system\nBe brief.<|im_end|>\n")
    else:
        assert trained_runs == ["Hello.<|eot|>", "Bye.<|eot|>"]
        assert "Be brief." in tokenizer.decode(ids) and "Hi?" in tokenizer.decode(ids)


def test_a_template_that_rewrites_earlier_turns_is_refused():
    tokenizer = load_tokenizer("byte")
    # Shows only the last assistant turn: rendering up to turn 3 is not a prefix of the whole conversation.
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}{{ m['role'] + ': ' + m['content'] + "
        "'\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    )
    with pytest.raises(DataError, match="does not render the conversation up to assistant turn 3"):
        formats.encode([("a", {"messages": CHAT})], "chat", tokenizer)


def test_formats_are_detected_and_a_mixed_or_unknown_dataset_is_refused_with_line_fields_and_formats(tmp_path):
    path = tmp_path / "data.jsonl"
    lines = [{"messages": CHAT}, {"messages": CHAT, "id": 1}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert formats.dataset_format(records.resolve(str(path)).records(), None, formats.FORMAT_NAMES) == ("chat", 2)
    path.write_text(path.read_text() + json.dumps({"instruction": "x", "output": "y"}) + "\n")
    with pytest.raises(DataError) as mixed:
        formats.dataset_format(records.resolve(str(path)).records(), None, formats.FORMAT_NAMES)
    said = str(mixed.value)
    assert said.startswith(f"{path}:3: record has fields ['instruction', 'output'], which is alpaca")
    assert f"are chat (from {path}:1)" in said and "--data-format" in said
    assert all(name in said for name in formats.FORMAT_NAMES)
    path.write_text(json.dumps({"question": "x", "answer": "y"}) + "\n")
    with pytest.raises(DataError, match=r":1: record has fields \['answer', 'question'\]; expected one of: chat"):
        formats.dataset_format(records.resolve(str(path)).records(), None, formats.FORMAT_NAMES)
    path.write_text(json.dumps({"text": "x"}) + "\n" + json.dumps({"prompt": "p"}) + "\n")
    with pytest.raises(DataError, match=r":2: record has fields \['prompt'\], and --data-format text reads"):
        formats.dataset_format(records.resolve(str(path)).records(), "text", formats.FORMAT_NAMES)
    path.write_text(json.dumps({"messages": CHAT}) + "\n")
    with pytest.raises(DataError, match="records are chat, and this model reads text"):
        formats.dataset_format(records.resolve(str(path)).records(), None, formats.ENCODER_FORMATS)


@pytest.mark.parametrize(
    ("record", "said"),
    [
        ({"prompt": 3, "response": "a"}, "field 'prompt' is int"),
        ({"messages": "hi"}, "field 'messages' is \"hi\", not a list of turns"),
        ({"messages": [{"role": "user"}]}, "turn 1 of 'messages' is"),
        ({"messages": [{"role": "user", "content": "x"}]}, "no assistant turn"),
        ({"instruction": "x", "input": 4, "output": "y"}, "field 'input' is int"),
    ],
)
def test_a_record_of_the_wrong_shape_is_named(record, said):
    with pytest.raises(DataError, match=f"^where: .*{said[:20]}"):
        formats.dataset_format([("where", record)], None, formats.FORMAT_NAMES)


def test_every_source_kind_gives_the_same_records(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": f"p{i}", "response": f"r{i}"} for i in range(5)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "b.json").write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    for name in ("a.jsonl", "b.json", "c.parquet"):
        assert [r for _, r in records.resolve(str(tmp_path / name)).records()] == rows, name
    folder = records.resolve(str(tmp_path))
    assert folder.kind == "files" and [r for _, r in folder.records()] == rows * 3
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    assert [r for _, r in records.resolve(str(saved)).records()] == rows
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dict"))
    assert [r for _, r in records.resolve(str(tmp_path / "dict")).records("train")] == rows
    with pytest.raises(DataError, match=r"has splits \['train'\], not 'test'"):
        list(records.resolve(str(tmp_path / "dict")).records("test"))
    text = tmp_path / "wiki.txt"
    text.write_text("First line.\nSecond line.\n\n\nAnother.\n")
    assert [r["text"] for _, r in records.resolve(str(text)).records()] == ["First line. Second line.", "Another."]
    assert records.resolve("owner/name").kind == "hub"
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="a .csv file; give .jsonl, .json or .parquet files"):
        records.resolve(str(tmp_path / "x.csv"))


def example(prompt: int, response: int, first: int) -> tuple[list[int], list[int]]:
    """Token ids first, first+1, ...; the prompt's labels IGNORE_INDEX, the response's its ids."""
    ids = list(range(first, first + prompt + response))
    return ids, [IGNORE_INDEX] * prompt + ids[prompt:]


def encoded_of(examples: list[tuple[list[int], list[int]]]) -> formats.Encoded:
    return formats.Encoded(
        ids=np.asarray([t for ids, _ in examples for t in ids], dtype=np.int32),
        labels=np.asarray([t for _, labels in examples for t in labels], dtype=np.int32),
        lengths=np.asarray([len(ids) for ids, _ in examples]),
    )


def whole_in_each_block(packed: dict) -> None:
    """No block holds a target whose example started in an earlier block: every block starts an example (position
    0), and within a block positions only restart at 0 or count on by one."""
    positions = packed["position_ids"]
    assert (positions[:, 0] == 0).all()
    steps = np.diff(positions, axis=1)
    assert ((steps == 1) | (positions[:, 1:] == 0)).all()


def test_whole_examples_are_packed_best_fit_decreasing_padded_and_never_split():
    examples = [example(3, 2, 100), example(1, 6, 200), example(2, 1, 300), example(1, 1, 400)]  # lengths 5 7 3 2
    packed = packing.pack_decoder(encoded_of(examples), seq_len=8, pad_id=0)
    whole_in_each_block(packed)
    # Longest first: 7 opens block 0; 5 opens block 1; 3 fits block 1 (room 3, the least that holds it); 2 needs a
    # third block (block 0 has 1 left, block 1 none). Padding fills the rest, as a sequence of its own.
    assert packed["input_ids"].tolist() == [
        [200, 201, 202, 203, 204, 205, 206, 0],
        [100, 101, 102, 103, 104, 300, 301, 302],
        [400, 401, 0, 0, 0, 0, 0, 0],
    ]
    assert packed["position_ids"].tolist() == [
        [0, 1, 2, 3, 4, 5, 6, 0],
        [0, 1, 2, 3, 4, 0, 1, 2],
        [0, 1, 0, 1, 2, 3, 4, 5],
    ]
    # Each example's first token is never a target (it would be predicted from the example before), nor padding.
    assert packed["labels"][1].tolist() == [IGNORE_INDEX] * 3 + [103, 104] + [IGNORE_INDEX] * 2 + [302]
    assert packed["labels"][2].tolist() == [IGNORE_INDEX, 401] + [IGNORE_INDEX] * 6
    assert [int(packed[k]) for k in ("padding", "truncated", "dropped")] == [7, 0, 0]


def test_a_long_example_loses_its_prompts_left_or_is_left_out_never_split():
    long = example(9, 3, 100)  # 12 tokens at seq_len 8: 4 to cut, all within the prompt after <bos>
    too_long = example(2, 9, 200)  # its response alone does not fit
    untrained = example(4, 0, 300)
    packed = packing.pack_decoder(encoded_of([long, too_long, untrained]), seq_len=8, truncation="left")
    assert packed["input_ids"].tolist() == [[100, 105, 106, 107, 108, 109, 110, 111]]  # <bos>, then the end
    assert packed["labels"].tolist() == [[IGNORE_INDEX] * 5 + [109, 110, 111]]
    assert [int(packed[k]) for k in ("padding", "truncated", "dropped")] == [0, 1, 2]
    dropped = packing.pack_decoder(encoded_of([long, example(1, 2, 500)]), seq_len=8, truncation="drop")
    assert dropped["input_ids"].tolist() == [[500, 501, 502, 0, 0, 0, 0, 0]] and int(dropped["dropped"]) == 1
    with pytest.raises(DataError, match="every example is left out at --seq-len 8"):
        packing.pack_decoder(encoded_of([too_long]), seq_len=8)


def test_text_runs_on_across_blocks_and_never_trains_a_documents_first_token():
    encoded = formats.Encoded(
        ids=np.arange(12, dtype=np.int32), labels=np.arange(12, dtype=np.int32), lengths=np.asarray([3, 5, 4])
    )
    packed = packing.pack_decoder(encoded, seq_len=5, whole=False)
    assert packed["input_ids"].tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # the tail of 2 dropped
    assert packed["position_ids"].tolist() == [[0, 1, 2, 0, 1], [2, 3, 4, 0, 1]]  # block 1 starts mid-document
    assert packed["labels"].tolist() == [[IGNORE_INDEX, 1, 2, IGNORE_INDEX, 4], [5, 6, 7, IGNORE_INDEX, 9]]
    with pytest.raises(DataError, match="fewer than one sequence of 16"):
        packing.pack_decoder(encoded, seq_len=16, whole=False)


def test_generated_dialogues_and_chats_around_seq_len_pack_whole(tmp_path):
    """Issue 50's acceptance: over llama2-tiny's own data (its generated dialogues, at its seq_len) and a chat set
    whose lengths lie around seq_len, no block holds a target of an example begun in an earlier block, and every
    trained token of every example kept is trained (truncation only ever takes prompt)."""
    from training.text.dialogues import write_dialogues
    from training.text.tokenizer import load_tokenizer
    from trainkit.bench.startup import write_chat
    from trainkit.job.models import get_model

    tokenizer = load_tokenizer("byte")
    seq_len = get_model("llama2-tiny").recipe.seq_len
    dialogues = write_dialogues(tmp_path / "dialogues.jsonl", count=200, seed=3)
    chats = write_chat(tmp_path / "chat.jsonl", count=200, seed=3, pairs=True)
    # The dialogues are all longer than seq_len (each loses some of its prompt); the prompt-response pairs of the
    # chat bench's conversations (268 to 308 tokens) lie around the length asked.
    for path, name, length in ((dialogues, "dialogue-summary", seq_len), (chats, "prompt-response", 286)):
        encoded = formats.encode(records.resolve(str(path)).records(), name, tokenizer)
        assert encoded.lengths.max() > length and (name != "prompt-response" or encoded.lengths.min() < length)
        packed = packing.pack_decoder(encoded, length)
        whole_in_each_block(packed)
        trained = sum(
            int((lab[1:] != IGNORE_INDEX).sum()) for lab in np.split(encoded.labels, np.cumsum(encoded.lengths)[:-1])
        )
        assert int(packed["dropped"]) == 0 and int(packed["truncated"]) > 0
        assert int((packed["labels"] != IGNORE_INDEX).sum()) == trained


def test_encoder_packing_frames_documents_laid_end_to_end():
    encoded = formats.Encoded(
        ids=np.asarray([10, 11, 12, 20, 21, 30, 31, 32, 33], dtype=np.int32),
        labels=None,
        lengths=np.asarray([3, 2, 4]),
    )
    rows = packing.pack_encoder(encoded, seq_len=6, cls_id=2, sep_id=3)["input_ids"]
    # the stream: 10 11 12 3 20 21 3 30 31 32 33 3 -> pieces of 4
    assert rows.tolist() == [[2, 10, 11, 12, 3, 3], [2, 20, 21, 3, 30, 3], [2, 31, 32, 33, 3, 3]]
    with pytest.raises(DataError, match="needs at least"):
        packing.pack_encoder(encoded, seq_len=2, cls_id=2, sep_id=3)


def test_the_encoder_reads_text_without_framing_and_skips_blank_documents():
    tokenizer = bert_tokenizer()
    encoded = formats.encode(
        [("a", {"text": "ab"}), ("b", {"text": "  "}), ("c", {"text": "c"})], "text", tokenizer, False
    )
    assert encoded.lengths.tolist() == [2, 1] and tokenizer.decode(encoded.ids.tolist()) == "abc"


def test_the_cache_key_follows_data_tokenizer_format_and_length_and_a_built_folder_is_reused(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "hello"}) + "\n")
    tokenizer = load_tokenizer("byte")
    source = records.resolve(str(path))
    key = cache.cache_key(source, "train", tokenizer, None, 8, "decoder")
    assert key == cache.cache_key(records.resolve(str(path)), "train", load_tokenizer("byte"), None, 8, "decoder")
    others = {
        cache.cache_key(source, "train", tokenizer, None, 16, "decoder"),
        cache.cache_key(source, "train", tokenizer, "text", 8, "decoder"),
        cache.cache_key(source, "train", tokenizer, None, 8, "encoder"),
        cache.cache_key(source, "train", bert_tokenizer(), None, 8, "decoder"),
    }
    assert key not in others and len(others) == 4
    templated = load_tokenizer("byte")
    templated.chat_template = HEADER_TEMPLATE
    assert cache.cache_key(source, "train", templated, None, 8, "decoder") != key
    path.write_text(json.dumps({"text": "hello!"}) + "\n")  # new size and time
    assert cache.cache_key(records.resolve(str(path)), "train", tokenizer, None, 8, "decoder") != key

    calls = []

    def build():
        calls.append(1)
        return {"input_ids": np.arange(6, dtype=np.int32).reshape(2, 3)}, {"rows": 2}

    first = cache.tokenized(tmp_path / "runs", key, build, builds_here=True)
    again = cache.tokenized(tmp_path / "runs", key, build, builds_here=True)
    waiter = cache.tokenized(tmp_path / "runs", key, build, builds_here=False)
    assert calls == [1] and first.built and not again.built and not waiter.built
    assert isinstance(again.arrays["input_ids"], np.memmap) and again.arrays["input_ids"].tolist() == [
        [0, 1, 2],
        [3, 4, 5],
    ]
    assert [p.name for p in (tmp_path / "runs" / cache.CACHE_DIR).iterdir()] == [key]  # no temporary left


def test_a_failed_build_publishes_nothing(tmp_path):
    def build():
        raise DataError("bad record")

    with pytest.raises(DataError):
        cache.tokenized(tmp_path, "k", build, builds_here=True)
    assert list((tmp_path / cache.CACHE_DIR).iterdir()) == []
