"""`invoke generate` (top level): try a finished decoder run's export on this machine, a prompt at a time or as a
chat (training/llm/generate.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from training.families import family_of
from training.spec import EXPORT_DIR, MERGED_DIR, SPEC_FILE, SUMMARY_FILE, read_job
from trainkit.backends import backend_of, last_submitted_to
from trainkit.backends.base import RunRef
from trainkit.cli.options import task, user_errors
from trainkit.errors import SpecError


def settings_of(max_new_tokens, temperature, seed):
    """The generation settings, each checked before anything is loaded."""
    from training.llm.generate import Settings

    try:
        tokens, heat, chosen = int(max_new_tokens or 128), float(temperature or 0), int(seed or 0)
    except (TypeError, ValueError) as error:
        raise SpecError(f"--max-new-tokens and --seed take whole numbers, --temperature a number ({error})") from None
    if not 1 <= tokens <= 1_000_000:
        raise SpecError(f"--max-new-tokens {tokens}: give a number of tokens from 1 up")
    if not (math.isfinite(heat) and heat >= 0):
        raise SpecError(f"--temperature {temperature}: give 0 (greedy) or a positive number (sampled)")
    if chosen < 0:
        raise SpecError(f"--seed {chosen}: give a non-negative integer")
    return Settings(tokens, heat, chosen)


def local_export(run_id: str | None, runs_dir: str, target: str | None) -> tuple[Path, str]:
    """(the export's folder, the format the run trained on) of a finished decoder run in this machine's runs folder;
    a run of another family, one that has not exported yet, or one held by a cloud target is refused saying why and
    what to do."""
    from trainkit.backends.local.runs import find_run

    ref = RunRef(run_id, runs_dir)
    if target is None and last_submitted_to(run_id) is None:
        try:
            run_dir = find_run(ref)
        except SpecError as error:
            raise SpecError(f"{error} (a run on EKS: give --target eks)") from None
    else:
        backend = backend_of(run_id, target, runs_dir)
        if backend.name != "local":
            raise SpecError(f"run {run_id or '(newest)'} is not in {runs_dir} here: {backend.export_location(run_id)}")
        run_dir = find_run(ref)
    job = read_job(run_dir / SPEC_FILE)
    family = family_of(job.model.family) if job.model.family else None
    if job.run.workload != "recipe" or family is None or not family.exports:
        what = f"a {family.kind} model" if family else f"a {job.run.workload} workload"
        raise SpecError(
            f"run {job.run.run_id} trained {what}, which leaves no text generator to load: `invoke generate` takes a "
            "decoder run (llama2-*, a Hugging Face causal LM)"
        )
    # A LoRA run's merged model when it wrote one (--export merged), else its export: a model, or PEFT's adapter.
    merged = run_dir / MERGED_DIR
    model_dir = merged if (merged / "config.json").is_file() else run_dir / EXPORT_DIR
    if not any((model_dir / name).is_file() for name in ("config.json", "adapter_config.json")):
        raise SpecError(
            f"run {job.run.run_id} has no export yet: a decoder run writes {model_dir} when it finishes "
            f"(`invoke status --run-id {job.run.run_id}`)"
        )
    try:
        trained_on = json.loads((run_dir / SUMMARY_FILE).read_text())["data"]["format"]
    except (OSError, ValueError, KeyError):
        trained_on = job.data.data_format or "text"
    return model_dir, trained_on


@task(
    help={
        "run-id": "The run whose export to load (default: the newest in --runs-dir).",
        "prompt": "What to continue: a user turn for a run trained on chat records, else the prompt its records' "
        "format frames (a dialogue to summarise, an instruction ...). Needed unless --interactive.",
        "max-new-tokens": "At most this many new tokens (default 128); the export's end-of-sequence token ends sooner.",
        "temperature": "0 (default): the most likely token each time; above 0: sampled at this temperature.",
        "seed": "Seed of the sampling (default 0): the same seed and settings give the same text.",
        "interactive": "A prompt per line from the console until an empty line (a chat run keeps the conversation).",
        "runs-dir": "Local runs folder (default runs).",
        "target": "Where the run ran, when it is not in --runs-dir (sagemaker, batch, eks): says where its export is.",
    }
)
@user_errors
def generate(
    c,
    run_id=None,
    prompt=None,
    max_new_tokens=None,
    temperature=None,
    seed=None,
    interactive=False,
    runs_dir="runs",
    target=None,
):
    """Text from a finished decoder run's export, with plain transformers on this machine (a local GPU, else the CPU),
    streamed as it is made; the prompt framed as the run's training records were (a chat run's chat template)."""
    settings = settings_of(max_new_tokens, temperature, seed)
    if not prompt and not interactive:
        raise SpecError("--prompt is required (or --interactive, for a prompt per line)")
    model_dir, trained_on = local_export(run_id, runs_dir, target)
    from training.llm import generate as generation

    model, tokenizer = generation.load(model_dir)
    if interactive:
        generation.chat(model, tokenizer, trained_on, settings, prompt or None, _read_line)
        return
    conversation = [{"role": "user", "content": prompt}]
    ids = generation.prompt_ids(tokenizer, trained_on, conversation)
    generation.generate(model, tokenizer, ids, settings, stop=generation.end_of_turn(tokenizer, trained_on))
    print(flush=True)


def _read_line() -> str | None:
    try:
        return input("> ").strip()
    except EOFError:
        return None


TASKS = (generate,)
