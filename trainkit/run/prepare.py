"""From a complete job to a ready run folder: inputs checked, spec.json written, generated data in place.

Both targets prepare a run with this code (on EKS every pod runs it on FSx, so it is race-safe: files
are published atomically and identical). A recipe's workers start from the spec.json it writes; other workloads
name their own preparation (trainkit/backends/base.py: Workload.prepare), which writes spec.json here too.
"""

from __future__ import annotations

import json
from pathlib import Path

from training.common.checkpoint import CHECKPOINTS_DIR, complete_steps, step_of_dir
from training.common.files import publish_text
from training.common.job import (
    MODEL_CONFIG,
    SPEC_FILE,
    SUMMARY_FILE,
    SYNTHETIC,
    SYNTHETIC_CORPUS,
    SYNTHETIC_DIALOGUES,
    SYNTHETIC_IMAGES,
    Job,
    dataset_path,
)
from training.llm.dialogues import write_dialogues
from trainkit.errors import SpecError
from trainkit.job.derive import continue_run
from trainkit.job.models import ModelEntry, get_model
from trainkit.run.secrets import require_hf_token
from trainkit.run.storage import check_free_space

SYNTHETIC_CLASSES = 10


def _local_dataset(job: Job) -> Path | None:
    """The dataset as a local path, None for a hub name; a local-looking path that is missing is an error."""
    dataset = dataset_path(job)
    path = Path(dataset).expanduser()
    if path.exists():
        return path
    if dataset.endswith((".jsonl", ".json", ".parquet", ".txt")) or dataset.startswith((".", "/", "~")):
        kinds = "a JSONL, JSON, Parquet or text file" if job.model.family == "bert" else "a JSONL, JSON or Parquet file"
        raise SpecError(f"--dataset {dataset} does not exist; give {kinds}, a dataset name or 'synthetic'")
    return None


def _check_text(job: Job, path: Path) -> None:
    """Every record of a local text dataset (a file or a folder of them), read through before anything starts: one
    bad record found here costs nothing; found by the workers, it costs a start and every elastic restart. The
    format is detected (or --data-format's checked) as the workers will."""
    from training.common.failure import DataError
    from training.text import formats, records

    allowed = formats.ENCODER_FORMATS if job.model.family == "bert" else formats.FORMAT_NAMES
    try:
        source = records.resolve(str(path))
        if source.kind == "files":
            formats.dataset_format(source.records(), job.data.data_format, allowed)
    except DataError as error:  # it names the file and line, what the record holds and what is accepted
        said = str(error)
        if said == "holds no records":
            raise SpecError(f"--dataset {path} holds no records; give one record per line (JSONL)") from None
        raise SpecError(said if said.startswith("--dataset") else f"--dataset {path}: {said}; fix it") from None
    except UnicodeDecodeError as error:
        raise SpecError(f"--dataset {path} is not UTF-8 text ({error.reason} at byte {error.start})") from None


def _check_vocabulary(job: Job) -> None:
    """The tokenizer the workers will load fits the model's vocabulary (a hub tokenizer is checked by the workers,
    which load it anyway)."""
    from training.llm import tokenizer as tokenizers

    entry = get_model(job.model.name)
    source = tokenizers.job_tokenizer_source(job)
    if source == tokenizers.BYTE_TOKENIZER:
        size = len(tokenizers.SPECIAL_TOKENS) + 256
    elif Path(source).expanduser().is_dir():
        size = len(tokenizers.load_tokenizer(source))
    else:
        return
    problem = tokenizers.vocabulary_problem(size, entry.arch.vocab_size, source)
    if problem:
        raise SpecError(f"--model {job.model.name}: {problem}")


def _check_image_folder(job: Job) -> None:
    from training.vision.layout import LayoutError, check_image_folder

    try:
        check_image_folder(dataset_path(job), flag="--data")
    except LayoutError as error:
        raise SpecError(str(error)) from None


def _check_inputs(job: Job) -> dict[str, str]:
    """What can only be checked now (token, data on disk), before anything is written. Returns secrets."""
    env: dict[str, str] = {}
    if job.model.init == "pretrained" and not Path(job.model.weights).expanduser().is_dir():
        env["HF_TOKEN"] = require_hf_token(job.model.weights, job.placement.hf_token_file)
    if job.model.family == "decoder":
        _check_vocabulary(job)
    if job.data.dataset != SYNTHETIC and job.model.family == "vision":
        _check_image_folder(job)
    elif job.data.dataset != SYNTHETIC:
        path = _local_dataset(job)
        if path is not None:
            _check_text(job, path)
    return env


def write_spec(job: Job) -> Path:
    """Write `runs/<run-id>/spec.json`, refusing to mix two different trainings in one run folder; a run launched
    again at another size continues (derive.continue_run), which `job.run.notes` then says."""
    path = job.run_dir / SPEC_FILE
    if path.exists():
        previous = Job.from_dict(json.loads(path.read_text()))
        note = continue_run(previous, job, last_checkpoint_step(job))
        if note and not (job.run_dir / SUMMARY_FILE).exists():  # a finished run only says so
            job.run.notes.append(note)
    return publish_text(path, json.dumps(job.to_dict(), indent=2, sort_keys=True) + "\n")


def last_checkpoint_step(job: Job) -> int | None:
    """The step of a recipe run's newest complete checkpoint (0: none yet); None for a workload whose checkpoints
    are its own (a script's)."""
    if job.run.workload != "recipe":
        return None
    complete = complete_steps(job.run_dir / CHECKPOINTS_DIR)
    return step_of_dir(complete[-1].name) if complete else 0


def _prepare_decoder(job: Job, entry: ModelEntry) -> None:
    if job.data.dataset == SYNTHETIC:
        dialogues = job.run_dir / SYNTHETIC_DIALOGUES
        if not dialogues.exists():
            write_dialogues(dialogues, seed=job.run.seed)
    if job.model.init == "random":
        config = entry.arch.truncated(job.model.layers).hf_config()
        publish_text(job.run_dir / MODEL_CONFIG, json.dumps(config, indent=2) + "\n")


def _prepare_bert(job: Job, entry: ModelEntry) -> None:
    from training.encoder.corpus import write_corpus

    if job.data.dataset == SYNTHETIC:
        corpus = job.run_dir / SYNTHETIC_CORPUS
        if not corpus.exists():
            write_corpus(corpus, seed=job.run.seed)
    config = entry.arch.truncated(job.model.layers).hf_config()
    publish_text(job.run_dir / MODEL_CONFIG, json.dumps(config, indent=2) + "\n")


def _prepare_vision(job: Job, entry: ModelEntry) -> None:
    from training.vision.layout import CROP_RATIO
    from training.vision.synthetic import SyntheticTree, write_tree

    publish_text(job.run_dir / MODEL_CONFIG, json.dumps({"num_classes": entry.arch.num_classes}) + "\n")
    if job.data.dataset == SYNTHETIC and not job.data.synthetic:
        size = round(job.data.image_size / CROP_RATIO)
        write_tree(job.run_dir / SYNTHETIC_IMAGES, SyntheticTree(classes=SYNTHETIC_CLASSES, size=size))


def prepare_run(job: Job, workload=None) -> dict[str, str]:
    """A recipe's preparation: check the inputs, then create the run folder (spec.json and what the workers read
    besides it). Returns the secrets the workers need, as environment variables (never arguments)."""
    entry = get_model(job.model.name)
    env = _check_inputs(job)
    check_free_space(job, entry)
    write_spec(job)
    {"vision": _prepare_vision, "bert": _prepare_bert, "decoder": _prepare_decoder}[entry.family](job, entry)
    return env


def prepare_folder(job: Job, workload=None) -> dict[str, str]:
    """The run folder and its spec.json only: for a workload that brings everything else itself (the sweep)."""
    job.run_dir.mkdir(parents=True, exist_ok=True)
    write_spec(job)
    return {}


def prepare_nothing(job: Job, workload=None) -> dict[str, str]:
    """A task that needs no run folder (the data copy writes where it is told and checks its own input)."""
    return {}
