"""From a complete job to a ready run folder: inputs checked, spec.json written, generated data in place.

Both targets prepare a run with this code (on EKS every pod runs it on FSx, so it is race-safe: files
are published atomically and identical). A recipe's workers start from the spec.json it writes; other workloads
name their own preparation (trainkit/run/workload.py: Workload.prepare), which writes spec.json here too.
"""

from __future__ import annotations

import json
from pathlib import Path

from training.common.checkpoint import CHECKPOINTS_DIR, complete_steps, step_of_dir
from training.common.files import publish_text
from training.families import family_of, launcher_hook
from training.spec import (
    SPEC_FILE,
    SUMMARY_FILE,
    SYNTHETIC,
    Job,
    dataset_path,
    weights_path,
)
from trainkit.errors import SpecError
from trainkit.job.derive import continue_run
from trainkit.job.models import ModelEntry, downloads_weights, get_model
from trainkit.run.secrets import require_hf_token
from trainkit.run.storage import check_free_space


def _local_dataset(job: Job) -> Path | None:
    """The dataset as a local path, None for a hub name; a local-looking path that is missing is an error."""
    dataset = dataset_path(job)
    path = Path(dataset).expanduser()
    if path.exists():
        return path
    if dataset.endswith((".jsonl", ".json", ".parquet", ".txt")) or dataset.startswith((".", "/", "~")):
        kinds = family_of(job.model.family).data_files
        raise SpecError(f"--dataset {dataset} does not exist; give {kinds}, a dataset name or 'synthetic'")
    return None


def _check_text(job: Job, path: Path, flag: str = "--dataset", forced: str | None = None) -> tuple[str, int] | None:
    """Every record of a local text dataset (a file or a folder of them), read through before anything starts: one
    bad record found here costs nothing; found by the workers, it costs a start and every elastic restart. The
    format is detected (or `forced`, --data-format's, checked) as the workers will. (format, records), None for a
    saved dataset folder (the workers read it)."""
    from training.common.failure import DataError
    from training.text import formats, records

    allowed = family_of(job.model.family).formats
    try:
        source = records.resolve(str(path), flag)
        if source.kind == "files":
            return formats.dataset_format(source.records(), forced or job.data.data_format, allowed)
        return None
    except DataError as error:  # it names the file and line, what the record holds and what is accepted
        said = str(error)
        if said == "holds no records":
            raise SpecError(f"{flag} {path} holds no records; give one record per line (JSONL)") from None
        raise SpecError(said if said.startswith(flag) else f"{flag} {path}: {said}; fix it") from None
    except UnicodeDecodeError as error:
        raise SpecError(f"{flag} {path} is not UTF-8 text ({error.reason} at byte {error.start})") from None


def _check_held_out(job: Job, trained: tuple[str, int] | None) -> None:
    """Local held-out records are the training records' format (--data-format's, else the one detected there), and
    --eval-fraction holds out at least one of them and leaves at least one to train on."""
    from training.common.failure import DataError
    from training.text.holdout import held_out_records

    held_out = job.evaluation
    if held_out.fraction and trained is not None:
        try:
            held_out_records(trained[1], held_out.fraction, job.run.seed)
        except DataError as error:
            raise SpecError(str(error)) from None
    path = Path(held_out.data).expanduser() if held_out.data else None
    if path is None or not path.exists():
        return
    forced = job.data.data_format or (trained[0] if trained else None)
    try:
        _check_text(job, path, "--eval-data", forced)
    except SpecError as error:
        if forced and not job.data.data_format:  # said as what it is: another format than the training records'
            raise SpecError(f"{error} (the training records are {forced}: held-out records must be too)") from None
        raise


def _check_inputs(job: Job, entry: ModelEntry) -> dict[str, str]:
    """What can only be checked now (token, data on disk), before anything is written. Returns secrets."""
    env: dict[str, str] = {}
    where = weights_path(job) if job.model.init == "pretrained" else None
    if where is not None and not Path(where).expanduser().is_dir():
        if not downloads_weights(job):  # a folder's path (or a channel's mount) with no folder there
            raise SpecError(
                f"--weights {job.model.weights}: no model folder at {where}; give the folder of a Hugging Face model "
                "(its config.json and weights) or a hub id (owner/name)"
            )
        env["HF_TOKEN"] = require_hf_token(job.model.weights, job.placement.hf_token_file)
    family = family_of(job.model.family)
    check = launcher_hook(family, "check_inputs")
    if check:
        check(job, entry)
    if family.text:
        path = _local_dataset(job) if job.data.dataset != SYNTHETIC else None
        trained = _check_text(job, path) if path is not None else None
        _check_held_out(job, trained)
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


def prepare_run(job: Job, workload=None) -> dict[str, str]:
    """A recipe's preparation: check the inputs, then create the run folder (spec.json and what the workers read
    besides it). Returns the secrets the workers need, as environment variables (never arguments)."""
    entry = get_model(job.model.name)
    env = _check_inputs(job, entry)
    check_free_space(job, entry)
    write_spec(job)
    prepare = launcher_hook(family_of(entry.family), "prepare")
    if prepare:
        prepare(job, entry)
    return env


def prepare_folder(job: Job, workload=None) -> dict[str, str]:
    """The run folder and its spec.json only: for a workload that brings everything else itself (the sweep)."""
    job.run_dir.mkdir(parents=True, exist_ok=True)
    write_spec(job)
    return {}


def prepare_nothing(job: Job, workload=None) -> dict[str, str]:
    """A task that needs no run folder (the data copy writes where it is told and checks its own input)."""
    return {}
