"""From a validated job spec to a ready run directory and the training command's arguments."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from training.llm.dialogues import write_dialogues

from .errors import SpecError
from .models import get_model
from .secrets import require_hf_token
from .spec import JobSpec, write_spec

ENTRY_POINTS = {"llama": "training.llm.train"}
SYNTHETIC = "synthetic"


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


def _dataset_argument(spec: JobSpec) -> str:
    if spec.dataset == SYNTHETIC:
        path = spec.run_dir / "data" / "dialogues.jsonl"
        if not path.exists():
            write_dialogues(path, seed=spec.seed)
        return str(path)
    local = _local_dataset(spec)
    return str(local) if local else spec.dataset


def _needs_token(spec: JobSpec) -> bool:
    return spec.init == "pretrained" and not Path(spec.weights).expanduser().is_dir()


def prepare_run(spec: JobSpec) -> PreparedRun:
    """Check what can only be checked now (token, dataset path), then create the run directory."""
    env: dict[str, str] = {}
    if _needs_token(spec):
        env["HF_TOKEN"] = require_hf_token(spec.weights, spec.hf_token_file)
    if spec.dataset != SYNTHETIC:
        _local_dataset(spec)  # fails before anything is written
    entry = get_model(spec.model)
    write_spec(spec)
    args = [
        "--run-dir",
        str(spec.run_dir),
        "--run-id",
        str(spec.run_id),
        "--model-name",
        spec.model,
        "--dataset",
        _dataset_argument(spec),
        "--dataset-split",
        spec.dataset_split,
        "--global-batch-size",
        str(spec.global_batch_size),
        "--micro-batch-size",
        str(spec.micro_batch_size),
        "--seq-len",
        str(spec.seq_len),
        "--lr",
        repr(spec.lr),
        "--schedule",
        spec.schedule,
        "--warmup-steps",
        str(spec.warmup_steps),
        "--weight-decay",
        repr(spec.weight_decay),
        "--grad-clip",
        repr(spec.grad_clip),
        "--sharding",
        spec.sharding,
        "--nodes",
        str(spec.nodes),
        "--precision",
        spec.precision,
        "--checkpoint-interval",
        str(spec.checkpoint_interval),
        "--keep-checkpoints",
        str(spec.keep_checkpoints),
        "--log-interval",
        str(spec.log_interval),
        "--seed",
        str(spec.seed),
        "--metrics-port",
        str(spec.metrics_port),
        "--activation-checkpointing" if spec.activation_checkpointing else "--no-activation-checkpointing",
    ]
    args += ["--epochs", str(spec.epochs)] if spec.epochs is not None else ["--steps", str(spec.steps)]
    if spec.peak_tflops is not None:
        args += ["--peak-tflops", repr(spec.peak_tflops)]
    if spec.truncated_label:
        args += ["--truncated-label", spec.truncated_label]
    if spec.init == "pretrained":
        args += ["--weights", spec.weights, "--tokenizer", spec.weights]
    else:
        config_path = spec.run_dir / "model_config.json"
        config_path.write_text(json.dumps(entry.arch.truncated(spec.layers).hf_config(), indent=2) + "\n")
        args += ["--model-config", str(config_path), "--tokenizer", "byte"]
    return PreparedRun(spec=spec, module=ENTRY_POINTS[entry.family], args=args, env=env)
