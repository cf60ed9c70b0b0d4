"""`invoke generate`'s prompt (training/llm/generate.py): framed as the run's training records framed theirs, so the
model sees at generation what it learned to continue."""

from __future__ import annotations

from training.llm.generate import prompt_ids
from training.text.tokenizer import load_tokenizer


def test_a_chat_runs_prompt_is_transformers_own_rendering_with_the_assistant_turn_opened():
    tokenizer = load_tokenizer("byte")  # carries trainkit's default chat template, as its export does
    conversation = [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another?"},
    ]
    expected = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert prompt_ids(tokenizer, "chat", conversation) == list(expected["input_ids"])


def test_a_pair_formats_prompt_is_its_template_after_bos_and_text_is_bos_then_the_text():
    tokenizer = load_tokenizer("byte")
    turn = [{"role": "user", "content": "A: hi\nB: bye"}]
    summarise = "Summarize the following dialogue.\n\nA: hi\nB: bye\n\nSummary:\n"
    assert prompt_ids(tokenizer, "dialogue-summary", turn) == [
        1,
        *tokenizer(summarise, add_special_tokens=False)["input_ids"],
    ]
    instruction = "### Instruction:\nA: hi\nB: bye\n\n### Response:\n"
    assert prompt_ids(tokenizer, "alpaca", turn) == [1, *tokenizer(instruction, add_special_tokens=False)["input_ids"]]
    raw = [1, *tokenizer("A: hi\nB: bye", add_special_tokens=False)["input_ids"]]
    assert prompt_ids(tokenizer, "prompt-response", turn) == raw and prompt_ids(tokenizer, "text", turn) == raw
