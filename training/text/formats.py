"""The shapes of text data trainkit trains on, and which tokens each puts the loss on.

    chat              {"messages": [{"role": "system"|"user"|"assistant"|..., "content": "..."}, ...]}
                      rendered with the tokenizer's chat template; loss on the assistant turns only
    alpaca            {"instruction": ..., "input": ... (optional), "output": ...}; loss on the output
    prompt-response   {"prompt": ..., "response": ...}; loss on the response
    dialogue-summary  {"dialogue": ..., "summary": ...} (DialogSum, SAMSum); loss on the summary
    text              {"text": ...} (continued pretraining; an encoder's corpus); loss on every token

A dataset is one format: detected from its records (the first format whose fields a record has, in the order above)
or forced with `--data-format`; a record of another format, or of none, is refused with where it is, the fields it
has and the formats accepted.

The pair formats (alpaca, prompt-response, dialogue-summary) are `<bos> prompt response <eos>`, the response and
`<eos>` trained. Chat takes the loss on each assistant turn as the template renders it, its end-of-turn marker
included (so the model learns to stop): from `{% generation %}` markers where the template has them (transformers'
`return_assistant_tokens_mask`), else by rendering the conversation up to each assistant turn (with the generation
prompt) and through it, the turn being the text between the two; most hub templates have no markers. A template
that does not render a conversation's beginning as a prefix of the whole (one that rewrites earlier turns) is
refused. A tokenizer without a template gets `DEFAULT_CHAT_TEMPLATE` (ChatML's turn markers, each assistant turn
ended by the tokenizer's end-of-sequence token), which the exported model ships with.

Detection and checks are torch-free (the launcher runs them); `encode` needs a tokenizer and numpy.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from training.common.failure import DataError

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Format:
    name: str
    fields: tuple[str, ...]
    optional: tuple[str, ...] = ()

    def described(self) -> str:
        optional = "".join(f", optional {name!r}" for name in self.optional)
        return f"{self.name} ({', '.join(map(repr, self.fields))}{optional})"


FORMATS = (
    Format("chat", ("messages",)),
    Format("alpaca", ("instruction", "output"), ("input",)),
    Format("prompt-response", ("prompt", "response")),
    Format("dialogue-summary", ("dialogue", "summary")),
    Format("text", ("text",)),
)
BY_NAME = {f.name: f for f in FORMATS}
FORMAT_NAMES = tuple(BY_NAME)
ENCODER_FORMATS = ("text",)
"""What an encoder pretrains on (masked language modelling needs no response)."""

DIALOGUE_PROMPT = "Summarize the following dialogue.\n\n{dialogue}\n\nSummary:\n"
ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
ALPACA_PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
"""The section headers of the Stanford Alpaca records' prompt (tatsu-lab/stanford_alpaca, README "Data Release"),
without its preamble sentence."""

DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token or '' }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token or '' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""For a tokenizer without a chat template: ChatML's turn markers (`<|im_start|>role` ... `<|im_end|>`, as Qwen's
templates use them), each assistant turn ended by the end-of-sequence token so generation stops there."""
DEFAULT_END_OF_TURN = "<|im_end|>"
"""How DEFAULT_CHAT_TEMPLATE ends a turn: plain text, not a special token, so a generated answer is cut there."""


def accepted(formats: Iterable[str] = FORMAT_NAMES) -> str:
    return "; ".join(BY_NAME[name].described() for name in formats)


def detect(record: dict) -> str | None:
    """The first format whose fields the record has, or None."""
    return next((f.name for f in FORMATS if all(name in record for name in f.fields)), None)


def check_record(record: dict, name: str) -> None:
    """The record has the format's fields, each of the right type (else a DataError that names the field)."""
    fmt = BY_NAME[name]
    missing = [field for field in fmt.fields if field not in record]
    if missing:
        raise DataError(
            f"record has fields {sorted(record)}, and --data-format {name} reads {fmt.described()}: missing "
            f"{', '.join(map(repr, missing))}"
        )
    if name == "chat":
        _check_messages(record["messages"])
        return
    for field in fmt.fields + tuple(f for f in fmt.optional if record.get(f) is not None):
        value = record[field]
        if not isinstance(value, str):
            kind = "null" if value is None else type(value).__name__
            raise DataError(f"field {field!r} is {kind} ({json.dumps(value, default=str)[:40]}), not text")


def _check_messages(messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise DataError(f"field 'messages' is {json.dumps(messages, default=str)[:40]}, not a list of turns")
    for number, turn in enumerate(messages, start=1):
        fields = turn if isinstance(turn, dict) else {}
        if not (isinstance(fields.get("role"), str) and isinstance(fields.get("content"), str)):
            shown = json.dumps(turn, default=str)[:60]
            raise DataError(f"turn {number} of 'messages' is {shown}; each turn is {{'role': text, 'content': text}}")
    if not any(turn["role"] == "assistant" for turn in messages):
        raise DataError("'messages' has no assistant turn, so nothing to train on")


def in_format(
    records: Iterable[tuple[str, dict]], forced: str | None, allowed: tuple[str, ...]
) -> tuple[str, Iterator[tuple[str, dict]]]:
    """(format, the records) of a dataset: the forced format, else the first record's; iterating the records checks
    each one, and that they all are that format."""
    iterator = iter(records)
    try:
        where, first = next(iterator)
    except StopIteration:
        raise DataError("holds no records") from None
    chosen = forced or detect(first)
    if chosen is None:
        raise DataError(f"{where}: record has fields {sorted(first)}; expected one of: {accepted(allowed)}")
    if chosen not in allowed:
        raise DataError(f"{where}: records are {chosen}, and this model reads {accepted(allowed)}")

    def checked() -> Iterator[tuple[str, dict]]:
        for place, record in itertools.chain([(where, first)], iterator):
            try:
                found = forced or detect(record)
                if found != chosen:
                    raise DataError(
                        f"record has fields {sorted(record)}, which is {found or 'no format'}, and the records before "
                        f"it are {chosen} (from {where}): one dataset holds one format (force one with --data-format). "
                        f"Accepted: {accepted(allowed)}"
                    )
                check_record(record, chosen)
            except DataError as error:
                raise DataError(f"{place}: {error}") from None
            yield place, record

    return chosen, checked()


def dataset_format(
    records: Iterable[tuple[str, dict]], forced: str | None, allowed: tuple[str, ...]
) -> tuple[str, int]:
    """(format, number of records) of a whole dataset, every record checked (what the launcher runs first)."""
    chosen, checked = in_format(records, forced, allowed)
    return chosen, sum(1 for _ in checked)


def pair(record: dict, name: str) -> tuple[str, str]:
    """(prompt, response) of a record in a pair format."""
    if name == "prompt-response":
        return record["prompt"], record["response"]
    if name == "dialogue-summary":
        return DIALOGUE_PROMPT.format(dialogue=record["dialogue"].strip()), record["summary"].strip()
    extra = (record.get("input") or "").strip()
    template = ALPACA_PROMPT_WITH_INPUT if extra else ALPACA_PROMPT
    return template.format(instruction=record["instruction"].strip(), input=extra), record["output"]


# ---------------------------------------------------------------------- tokens and labels

CHUNK = 2048
"""Records tokenised per call: the fast tokenizers spread a batch over threads; arrays are kept per chunk."""


@dataclass
class Encoded:
    """Examples laid end to end: token ids, their labels (IGNORE_INDEX where no loss) and each example's length."""

    ids: object  # numpy int32 arrays
    labels: object
    lengths: object


def encode(records: Iterable[tuple[str, dict]], name: str, tokenizer, framed: bool = True, workers: int = 1) -> Encoded:
    """Every record of format `name` as tokens and labels (see the module docstring for which tokens are trained).
    `framed=False` (an encoder's documents): text without <bos>/<eos>, blank documents left out. `workers` > 1
    tokenises chunks in that many forked processes (the records are read and checked here, in order)."""
    import numpy as np

    parts = []
    chunks = (
        ([record for _where, record in chunk if framed or record["text"].strip()], name, framed)
        for chunk in _chunks(records, CHUNK)  # records already checked (in_format)
    )
    global _POOL_TOKENIZER
    if workers > 1:
        import multiprocessing

        # Explicit, so the forked children neither warn about nor deadlock on the parent's tokenizer threads.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        _POOL_TOKENIZER = tokenizer
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            parts = list(pool.imap(_chunk_arrays, chunks))
        _POOL_TOKENIZER = None
    else:
        parts = [_chunk_arrays(chunk, tokenizer) for chunk in chunks]
    parts = [part for part in parts if len(part[2])]
    if not parts:
        raise DataError("holds no records")
    ids, labels, lengths = zip(*parts, strict=True)
    return Encoded(np.concatenate(ids), np.concatenate(labels), np.concatenate(lengths))


_POOL_TOKENIZER = None
"""The tokenizer forked pool workers use (inherited at the fork, never pickled)."""


def _chunk_arrays(chunk: tuple[list[dict], str, bool], tokenizer=None):
    """(ids, labels, lengths) numpy arrays of one chunk of records."""
    import numpy as np

    records, name, framed = chunk
    examples = _encode_chunk(records, name, tokenizer or _POOL_TOKENIZER, framed)
    lengths = np.fromiter((len(ids) for ids, _labels in examples), dtype=np.int64, count=len(examples))
    flat_ids = np.fromiter(itertools.chain.from_iterable(ids for ids, _ in examples), dtype=np.int32)
    flat_labels = np.fromiter(itertools.chain.from_iterable(labels for _, labels in examples), dtype=np.int32)
    return flat_ids, flat_labels, lengths


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _encode_chunk(records: list[dict], name: str, tokenizer, framed: bool) -> list[tuple[list[int], list[int]]]:
    bos = [tokenizer.bos_token_id] if framed and tokenizer.bos_token_id is not None else []
    eos = [tokenizer.eos_token_id] if framed else []
    if name == "text":
        texts = _tokenized(tokenizer, [r["text"] for r in records])
        return [(bos + t + eos, bos + t + eos) for t in texts]
    if name == "chat":
        return (
            [chat_example(record["messages"], tokenizer) for record in records]
            if _has_markers(tokenizer)
            else (_chat_by_prefixes(records, tokenizer))
        )
    pairs = [pair(record, name) for record in records]
    prompts = _tokenized(tokenizer, [p for p, _ in pairs])
    responses = _tokenized(tokenizer, [r for _, r in pairs])
    return [
        (bos + p + r + eos, [IGNORE_INDEX] * (len(bos) + len(p)) + r + eos)
        for p, r in zip(prompts, responses, strict=True)
    ]


def _tokenized(tokenizer, texts: list[str], offsets: bool = False) -> list:
    """Token ids of each text without added special tokens (and each token's character offsets), as
    `tokenizer(texts, add_special_tokens=False)` gives them; straight from the fast tokenizer's Rust core where
    there is one (the Python wrapper's per-text conversion costs as much as the tokenising)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        out = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=offsets)
        return list(zip(out["input_ids"], out["offset_mapping"], strict=True)) if offsets else out["input_ids"]
    encodings = backend.encode_batch(texts, add_special_tokens=False)
    return [(e.ids, e.offsets) for e in encodings] if offsets else [e.ids for e in encodings]


def chat_template(tokenizer) -> str:
    """The template a chat dataset is rendered with: the tokenizer's, else the stated default."""
    return tokenizer.chat_template or DEFAULT_CHAT_TEMPLATE


def _has_markers(tokenizer) -> bool:
    template = chat_template(tokenizer)
    return "{% generation %}" in template or "{%- generation %}" in template or "{% generation -%}" in template


class Renderer:
    """The tokenizer's chat template, compiled once, rendered as `apply_chat_template(tokenize=False)` renders it
    (transformers' own compiled template, with the tokenizer's special tokens as variables) without that call's
    per-conversation checks: a chat dataset renders each conversation once per assistant turn and once whole."""

    def __init__(self, tokenizer):
        from transformers.utils.chat_template_utils import _compile_jinja_template

        self.template = _compile_jinja_template(chat_template(tokenizer))
        self.variables = dict(tokenizer.special_tokens_map)

    def __call__(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.template.render(messages=messages, add_generation_prompt=generation_prompt, **self.variables)


def assistant_spans(messages: list[dict], render: Renderer) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns (see the module docstring)."""
    full = render(messages, False)
    spans = []
    for index, turn in enumerate(messages):
        if turn["role"] != "assistant":
            continue
        before = render(messages[:index], True) if index else ""
        through = full if index == len(messages) - 1 else render(messages[: index + 1], False)
        if not (full.startswith(through) and through.startswith(before)):
            raise DataError(
                f"the chat template does not render the conversation up to assistant turn {index + 1} as the start of "
                "the whole conversation (it rewrites earlier turns), so the turn's tokens cannot be found: give "
                "records whose template renders that way, or a template with {% generation %} markers"
            )
        spans.append((len(before), len(through)))
    return full, spans


def _chat_by_prefixes(records: list[dict], tokenizer) -> list[tuple[list[int], list[int]]]:
    render = Renderer(tokenizer)
    rendered = [assistant_spans(record["messages"], render) for record in records]
    encoded = _tokenized(tokenizer, [text for text, _spans in rendered], offsets=True)
    examples = []
    for (ids, offsets), (_text, spans) in zip(encoded, rendered, strict=True):
        starts = [offset[0] for offset in offsets]  # increasing: a token is trained where it starts in a span
        labels = [IGNORE_INDEX] * len(ids)
        for start, end in spans:
            first, last = bisect.bisect_left(starts, start), bisect.bisect_left(starts, end)
            labels[first:last] = ids[first:last]
        examples.append((ids, labels))
    return examples


def chat_example(messages: list[dict], tokenizer) -> tuple[list[int], list[int]]:
    """A template with `{% generation %}` markers says itself which tokens are the assistant's."""
    out = tokenizer.apply_chat_template(
        messages,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
        chat_template=chat_template(tokenizer),
    )
    ids = list(out["input_ids"])
    mask = out["assistant_masks"]
    return ids, [token if keep else IGNORE_INDEX for token, keep in zip(ids, mask, strict=True)]
