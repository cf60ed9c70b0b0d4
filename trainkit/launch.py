"""From a validated job spec to a ready run directory and the training command's arguments."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from training.common.files import publish_text
from training.llm.dialogues import write_dialogues

from .errors import SpecError
from .models import ModelEntry, get_model
from .secrets import require_hf_token
from .spec import JobSpec, write_spec
from .storage import check_free_space

ENTRY_POINTS = {"llama": "training.llm.train", "vision": "training.vision.train"}
SYNTHETIC = "synthetic"
SYNTHETIC_CLASSES = 10


@dataclass
class PreparedRun:
    spec: JobSpec
    module: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict, repr=False)  # secrets live here, never in args


def _local_dataset(spec: JobSpec) -> Path | None:
    """The dataset as a local path, None for a hub name; a local-looking path that is missing is an error."""
    path = Path(spec.dataset).expanduser()
    if path.exists():
        return path
    if spec.dataset.endswith((".jsonl", ".json")) or spec.dataset.startswith((".", "/", "~")):
        raise SpecError(f"--dataset {spec.dataset} does not exist; give a JSONL file, a dataset name or 'synthetic'")
    return None


def _check_records(path: Path) -> None:
    """Every record of a local JSONL file, read through before anything starts: one bad line found here
    costs nothing; found by the workers, it costs a start and every elastic restart."""
    from training.llm.data import check_records

    try:
        count = check_records(path)
    except ValueError as error:
        raise SpecError(f"--dataset {path} {error}; fix that record or remove it") from None
    if count == 0:
        raise SpecError(f"--dataset {path} has no records; give a JSONL file with one record per line")


def _check_image_folder(spec: JobSpec) -> None:
    from training.vision.layout import LayoutError, check_image_folder

    try:
        check_image_folder(spec.dataset, flag="--data")
    except LayoutError as error:
        raise SpecError(str(error)) from None


def _needs_token(spec: JobSpec) -> bool:
    return spec.init == "pretrained" and not Path(spec.weights).expanduser().is_dir()


def _check_inputs(spec: JobSpec, family: str) -> dict[str, str]:
    """What can only be checked now (token, data on disk), before anything is written. Returns secrets."""
    env: dict[str, str] = {}
    if _needs_token(spec):
        env["HF_TOKEN"] = require_hf_token(spec.weights, spec.hf_token_file)
    if spec.dataset != SYNTHETIC and family == "vision":
        _check_image_folder(spec)
    elif spec.dataset != SYNTHETIC:
        path = _local_dataset(spec)
        if path is not None and path.is_file():
            _check_records(path)
    return env


def _flags(pairs: dict[str, object]) -> list[str]:
    """--name value for every pair whose value is not None (floats kept exact with repr)."""
    args: list[str] = []
    for name, value in pairs.items():
        if value is not None:
            args += [f"--{name}", repr(value) if isinstance(value, float) else str(value)]
    return args


def _common_args(spec: JobSpec) -> list[str]:
    return _flags(
        {
            "run-dir": spec.run_dir,
            "run-id": spec.run_id,
            "model-name": spec.model,
            "steps": spec.steps,
            "epochs": spec.epochs,
            "global-batch-size": spec.global_batch_size,
            "micro-batch-size": spec.micro_batch_size,
            "lr": float(spec.lr),
            "schedule": spec.schedule,
            "warmup-steps": spec.warmup_steps,
            "weight-decay": float(spec.weight_decay),
            "grad-clip": float(spec.grad_clip),
            "nodes": spec.nodes,
            "precision": spec.precision,
            "checkpoint-interval": spec.checkpoint_interval,
            "keep-checkpoints": spec.keep_checkpoints,
            "log-interval": spec.log_interval,
            "seed": spec.seed,
            "metrics-port": spec.metrics_port,
            "collective-timeout-s": float(spec.collective_timeout),
        }
    )


def _llama_args(spec: JobSpec, entry: ModelEntry) -> list[str]:
    if spec.dataset == SYNTHETIC:
        dataset = spec.run_dir / "data" / "dialogues.jsonl"
        if not dataset.exists():
            write_dialogues(dataset, seed=spec.seed)
    else:
        dataset = _local_dataset(spec) or spec.dataset
    args = _flags(
        {
            "dataset": dataset,
            "dataset-split": spec.dataset_split,
            "seq-len": spec.seq_len,
            "sharding": spec.sharding,
            "peak-tflops": spec.peak_tflops,
            "truncated-label": spec.truncated_label,
        }
    )
    args.append("--activation-checkpointing" if spec.activation_checkpointing else "--no-activation-checkpointing")
    if spec.init == "pretrained":
        return args + ["--weights", spec.weights, "--tokenizer", spec.weights]
    config_path = spec.run_dir / "model_config.json"
    publish_text(config_path, json.dumps(entry.arch.truncated(spec.layers).hf_config(), indent=2) + "\n")
    return args + ["--model-config", str(config_path), "--tokenizer", "byte"]


def _vision_args(spec: JobSpec, entry: ModelEntry) -> list[str]:
    from training.vision.layout import CROP_RATIO
    from training.vision.synthetic import SyntheticTree, write_tree

    if spec.synthetic:
        data = ["--synthetic", "--num-classes", str(entry.arch.num_classes)]
    elif spec.dataset == SYNTHETIC:
        size = round(spec.image_size / CROP_RATIO)
        root = write_tree(spec.run_dir / "data" / "imagenet", SyntheticTree(classes=SYNTHETIC_CLASSES, size=size))
        data = ["--data", str(root)]
    else:
        data = ["--data", str(Path(spec.dataset).expanduser().resolve())]
    return data + _flags(
        {
            "image-size": spec.image_size,
            "optimizer": spec.optimizer,
            "label-smoothing": float(spec.label_smoothing),
            "loader-workers": spec.loader_workers,
            "warmup-epochs": None if spec.warmup_epochs is None else float(spec.warmup_epochs),
        }
    )


def prepare_run(spec: JobSpec) -> PreparedRun:
    """Check the inputs, then create the run directory and build the entry point's arguments."""
    entry = get_model(spec.model)
    env = _check_inputs(spec, entry.family)
    check_free_space(spec, entry)
    write_spec(spec)
    extra = _vision_args(spec, entry) if entry.family == "vision" else _llama_args(spec, entry)
    return PreparedRun(spec=spec, module=ENTRY_POINTS[entry.family], args=_common_args(spec) + extra, env=env)
