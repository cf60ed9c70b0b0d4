"""The decoder family's launcher side (training/families.py `launch`): what the launcher checks and writes for a
decoder job before any worker starts. Torch-free: the launcher imports it; the workers never do."""

from __future__ import annotations

import json
from pathlib import Path

from training.common.failure import SpecError
from training.common.files import publish_text
from training.decoders import DecoderArch
from training.families import DECODER
from training.spec import MODEL_CONFIG, SYNTHETIC, Job
from training.text import tokenizer as tokenizers
from training.text.dialogues import write_dialogues


def check_inputs(job: Job, entry) -> None:
    """The tokenizer the workers will load fits the model's vocabulary (a hub tokenizer is checked by the workers,
    which load it anyway)."""
    source = tokenizers.job_tokenizer_source(job)
    if source != tokenizers.BYTE_TOKENIZER and not Path(source).expanduser().is_dir():
        return
    problem = tokenizers.vocabulary_problem(tokenizers.tokenizer_size(source), entry.arch.vocab_size, source)
    if problem:
        raise SpecError(f"--model {job.model.name}: {problem}")


def prepare(job: Job, entry) -> None:
    """The synthetic dialogues for `--dataset synthetic`, and a random-init model's config."""
    if job.data.dataset == SYNTHETIC:
        dialogues = job.run_dir / DECODER.synthetic
        if not dialogues.exists():
            write_dialogues(dialogues, seed=job.run.seed)
    if job.model.init == "random":
        config = entry.arch.truncated(job.model.layers).hf_config()
        publish_text(job.run_dir / MODEL_CONFIG, json.dumps(config, indent=2) + "\n")


def flops_per_item(job: Job, config: dict) -> float:
    """Training FLOPs per token at the job's sequence length (`invoke bench train`'s MFU), under LoRA the frozen
    weights' 4 and the adapters' 6 (training/common/flops.py); `config`: the model's config.json."""
    shape = DecoderArch.from_config(config).shape()
    lora = job.lora
    adapters = shape.adapter_params(lora.rank, lora.target_names) if lora.enabled else None
    return shape.flops_per_token(job.data.seq_len, adapter_params=adapters)
