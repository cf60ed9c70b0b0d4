"""The BERT family's launcher side (training/families.py `launch`): what the launcher says and writes for a BERT
job before any worker starts. Torch-free: the launcher imports it; the workers never do."""

from __future__ import annotations

import json

from training.common.files import publish_text
from training.encoder.corpus import BYTE_VOCABULARY, write_corpus
from training.families import BERT
from training.spec import MODEL_CONFIG, SYNTHETIC, Job


def notes(job: Job, entry) -> list[str]:
    """BERT trains on bytes (corpus.py byte_tokenizer), not the WordPiece vocabulary its published shapes have: said
    at the start of every job of one (not bert-tiny's, sized for bytes), so nobody compares its losses with the
    paper's (issue 50)."""
    vocabulary, seq_len = entry.arch.vocab_size, job.data.seq_len
    if vocabulary <= 2 * BYTE_VOCABULARY:
        return []
    return [
        f"{job.model.name} trains with the byte tokenizer (one token per UTF-8 byte: {BYTE_VOCABULARY} of its "
        f"{vocabulary:,} embedding rows used; --seq-len {seq_len} holds about {(seq_len or 0) // 5} English "
        "words): its losses, accuracy and tokens/s are not comparable to WordPiece-trained BERT's (docs/data.md)"
    ]


def prepare(job: Job, entry) -> None:
    """The synthetic corpus for `--dataset synthetic`, and the model's config (BERT trains from random weights)."""
    if job.data.dataset == SYNTHETIC:
        corpus = job.run_dir / BERT.synthetic
        if not corpus.exists():
            write_corpus(corpus, seed=job.run.seed)
    config = entry.arch.truncated(job.model.layers).hf_config()
    publish_text(job.run_dir / MODEL_CONFIG, json.dumps(config, indent=2) + "\n")
