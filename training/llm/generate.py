"""`invoke generate`: text from a finished decoder run's export (its model/ folder), loaded with plain transformers on
this machine (a local GPU when there is one, else the CPU), the prompt framed as the run's training records framed
theirs, the new text streamed as it is made."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from training.text import formats


@dataclass(frozen=True)
class Settings:
    max_new_tokens: int
    temperature: float
    """0: greedy (the most likely token each time); above 0: sampled at that temperature."""
    seed: int


def load(model_dir: Path):
    """(model, tokenizer) of an export, in eval mode on this machine's device, in the dtype it was saved in."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the console shows the generated text only
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if (model_dir / "adapter_config.json").is_file():  # a LoRA run's adapter: onto the base it names (PEFT's way)
        from peft import PeftModel

        base_source = json.loads((model_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
        base = AutoModelForCausalLM.from_pretrained(base_source, dtype="auto", token=os.environ.get("HF_TOKEN"))
        model = PeftModel.from_pretrained(base, model_dir).to(device).eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto").to(device).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def prompt_ids(tokenizer, data_format: str, conversation: list[dict]) -> list[int]:
    """The prompt's tokens as the run's records framed a prompt (training/text/formats.py): a chat run's conversation
    through its chat template with the assistant's turn opened; a pair format's prompt field in its template after
    <bos>; text after <bos>. `conversation`: the turns so far, the user's last (earlier turns count for chat only)."""
    if data_format == "chat":
        rendered = formats.Renderer(tokenizer)(conversation, True)
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]
    text = conversation[-1]["content"]
    field = {"prompt-response": "prompt", "dialogue-summary": "dialogue", "alpaca": "instruction"}.get(data_format)
    if field is not None:
        text, _response = formats.pair({field: text, "response": "", "summary": "", "output": ""}, data_format)
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return bos + tokenizer(text, add_special_tokens=False)["input_ids"]


def end_of_turn(tokenizer, data_format: str) -> str | None:
    """The text that ends an assistant turn in a chat run's template when it is not a special token (trainkit's
    default template's `<|im_end|>`): generation stops there, and the answer is cut there."""
    default = data_format == "chat" and tokenizer.chat_template == formats.DEFAULT_CHAT_TEMPLATE
    return formats.DEFAULT_END_OF_TURN if default else None


def generate(
    model, tokenizer, ids: list[int], settings: Settings, stream: bool = True, stop: str | None = None
) -> list[int]:
    """The new tokens after `ids`, streamed to stdout as they come: `model.generate` with the settings, the seed set
    first (as a direct call with the same seed and settings makes the same tokens), the rest from the export's
    generation config (its end-of-sequence token stops it; `stop`, a turn's end in text, too)."""
    import torch
    from transformers import TextStreamer

    torch.manual_seed(settings.seed)
    inputs = torch.tensor([ids], device=model.device)
    sampled = settings.temperature > 0
    extra = {"temperature": settings.temperature} if sampled else {}
    if stop:
        extra |= {"stop_strings": [stop], "tokenizer": tokenizer}
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if stream else None
    with torch.no_grad():
        out = model.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),
            max_new_tokens=settings.max_new_tokens,
            do_sample=sampled,
            streamer=streamer,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
            **extra,
        )
    return out[0, len(ids) :].tolist()


def chat(
    model, tokenizer, data_format: str, settings: Settings, first: str | None, read: Callable[[], str | None]
) -> None:
    """`--interactive`: a prompt per line until an empty line or the end of input. A chat run keeps the conversation
    (each answer is the next turn's context); other formats answer each prompt alone."""
    conversation: list[dict] = []
    prompt = first
    while True:
        if prompt is None:
            prompt = read()
        if not prompt:
            return
        conversation = (conversation if data_format == "chat" else []) + [{"role": "user", "content": prompt}]
        stop = end_of_turn(tokenizer, data_format)
        new = generate(model, tokenizer, prompt_ids(tokenizer, data_format, conversation), settings, stop=stop)
        answer = tokenizer.decode(new, skip_special_tokens=True)
        conversation.append({"role": "assistant", "content": answer.split(stop)[0] if stop else answer})
        sys.stdout.write("\n")
        sys.stdout.flush()
        prompt = None
