"""The run folder's contract between the launcher and the workers: the files the launcher prepares, the
environment every process of a run gets, where the data is, and the workers' one argument."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from training.families import FAMILIES, family_of
from training.spec.options import SPEC_FILE, SYNTHETIC
from training.spec.schema import Job, read_job

# ---------------------------------------------------------------------- files the launcher prepares

MODEL_CONFIG = "model_config.json"
"""In the run folder: what the workers build a randomly initialised model from (language models: a
Hugging Face config.json; vision: the class count of synthetic input)."""
EXPORT_DIR = "model"
"""In the run folder: a decoder run's export, a Hugging Face model folder (`invoke generate` loads it); under LoRA,
PEFT's adapter folder."""
MERGED_DIR = "model-merged"
"""In the run folder: a LoRA run's model with its adapters merged in (--export merged), a Hugging Face model folder."""
RANK_LOGS_DIR = "ranks"
RUN_DIR_ENV = "TRAINKIT_RUN_DIR"
"""Every process of a run finds its run folder here (the launcher sets it; a user's script reads it)."""
CHECKPOINT_DIR_ENV = "TRAINKIT_CHECKPOINT_DIR"
"""A user's script keeps its checkpoints here (training/script.py)."""
SCRIPT_LABEL_ENV = "TRAINKIT_SCRIPT"
"""A user's script's name, for its metrics' `model` label."""
"""logs/<this>/<rank>.json in the run folder: the files torchrun sends each rank's output to, recorded
by the rank itself (`invoke logs --rank`)."""
METRICS_PORT_OFFSET_ENV = "TRAINKIT_METRICS_PORT_OFFSET"
"""Added to the metrics port by launchers that run several nodes on one machine, so each node's ranks
get their own block of ports (rank r of the job serves port + r, as on one node)."""
PROGRESS_ENV = "TRAINKIT_PROGRESS"
"""How rank 0 shows progress: `bar` (a tqdm bar; the launcher sets it when its console is a terminal) or,
by default, `lines` (one plain line per tenth of the run: logs, pipes and `kubectl logs`)."""
SYNTHETIC_DIALOGUES = FAMILIES["decoder"].synthetic
SYNTHETIC_IMAGES = FAMILIES["vision"].synthetic
SYNTHETIC_CORPUS = FAMILIES["bert"].synthetic


DATA_MOUNT_ENV = "TRAINKIT_DATA_MOUNT"
"""The folder where the target mounted an s3:// dataset (SageMaker: the job's `data` channel). The run's spec keeps
the URL as given, so a run resubmitted with other data is still refused as another run."""


EVAL_MOUNT_ENV = "TRAINKIT_EVAL_MOUNT"
"""The folder where the target mounted an s3:// --eval-data (SageMaker: the job's `eval` channel)."""
WEIGHTS_MOUNT_ENV = "TRAINKIT_WEIGHTS_MOUNT"
"""The folder where the target mounted s3:// --weights (SageMaker: the job's `weights` channel)."""


def dataset_path(job: Job) -> str:
    """The dataset as this machine reads it: an s3:// URL where the target mounted it (DATA_MOUNT_ENV), anything
    else as given."""
    return _mounted(job.data.dataset, os.environ.get(DATA_MOUNT_ENV))


def eval_data_path(job: Job) -> str | None:
    """--eval-data as this machine reads it, as `dataset_path` reads --data (EVAL_MOUNT_ENV)."""
    data = job.evaluation.data
    return _mounted(data, os.environ.get(EVAL_MOUNT_ENV)) if data else None


def weights_path(job: Job) -> str | None:
    """--weights as this machine reads them (a hub id, a folder, or an s3:// prefix where the target mounted it)."""
    weights = job.model.weights
    return _mounted(weights, os.environ.get(WEIGHTS_MOUNT_ENV)) if weights else None


def _mounted(url: str, mount: str | None) -> str:
    """An s3:// URL where the target mounted it, anything else as given. A URL that does not end in `/` may name one
    object, or a prefix whose last part SageMaker keeps as a folder: what the mount holds under that name is the
    data, else the mount itself."""
    if not (mount and url.startswith("s3://")):
        return url
    named = Path(mount) / url.rsplit("/", 1)[-1]
    return str(named) if not url.endswith("/") and named.exists() else mount


def data_source(job: Job, run_dir: Path) -> str:
    """Where the workers read the dataset: the data the launcher generated into the run folder for
    `synthetic`, else the user's path (home expanded, as the launcher checked it; where the target mounted an
    s3:// one) or a hub name."""
    if job.data.dataset == SYNTHETIC:
        return str(run_dir / family_of(job.model.family or "decoder").synthetic)
    path = Path(dataset_path(job)).expanduser()
    return str(path) if path.exists() else job.data.dataset


def worker_arguments(run_dir: Path) -> list[str]:
    """The training entry points' only argument: the run's spec.json."""
    return ["--spec", str(run_dir / SPEC_FILE)]


def parse_worker_arguments(argv: list[str] | None, description: str) -> tuple[Job, Path]:
    """(job, run folder) from `--spec runs/<run-id>/spec.json`: the run folder is where spec.json is."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--spec", required=True, help="The run's spec.json, written by the launcher.")
    path = Path(parser.parse_args(argv).spec)
    return read_job(path), path.parent
