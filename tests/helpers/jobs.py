"""Jobs as tests read them: every field by its flag's name, whatever section declares it; and the walks, jobs
that together give every option a value."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from training.spec import Job, all_fields
from trainkit.backends import job_from_flags
from trainkit.backends.sagemaker.request import CHECKPOINTS


def flat(job: Job) -> SimpleNamespace:
    values = {spec.key: spec.get(job) for spec in all_fields()}
    return SimpleNamespace(
        **values, world_size=job.world_size, grad_accum_steps=job.grad_accum_steps, run_dir=job.run_dir, job=job
    )


def build_spec(flags: dict, profile: str = "local") -> SimpleNamespace:
    """The complete job for these flags (trainkit.backends.job_from_flags), read flat."""
    return flat(job_from_flags(flags, profile))


def spec_file(run_dir: Path) -> SimpleNamespace:
    """A run's spec.json, read flat."""
    return flat(Job.from_dict(json.loads((Path(run_dir) / "spec.json").read_text())))


# A value other than the default for every option, in four jobs that together use them all.
WALKS = {
    "llama-local": {
        "model": "llama2-tiny",
        "layers": 3,
        "dataset": "org/dialogues",
        "dataset_split": "validation",
        "data_format": "chat",
        "packing": "concat",
        "truncation": "drop",
        "seq_len": 64,
        "steps": 7,
        "global_batch_size": 8,
        "micro_batch_size": 2,
        "lr": 0.002,
        "schedule": "constant",
        "warmup_steps": 2,
        "weight_decay": 0.01,
        "grad_clip": 0.5,
        "nodes": 2,
        "nproc": 1,
        "precision": "fp32",
        "activation_checkpointing": True,
        "ac_every": 2,
        "prefetch": 2,
        "reshard_last_layer": False,
        "attention": "math",
        "fused_adamw": True,
        "compile": True,
        "checkpoint_interval": 3,
        "keep_checkpoints": 3,
        "storage_mb_s": 350.5,
        "max_restarts": 1,
        "collective_timeout": 120,
        "stall_timeout": 300,
        "rdzv": "etcd",
        "rdzv_endpoint": "127.0.0.1:2379",
        "run_id": "walk-llama",
        "seed": 7,
        "log_interval": 2,
        "metrics_port": 9500,
        "peak_tflops": 100.0,
        "hf_token_file": "{tmp}/token",  # the test writes it
        "target": "local",
    },
    "vision-local": {
        "model": "resnet-tiny",
        "image_size": 48,
        "synthetic": True,
        "loader_workers": 0,
        "channels_last": True,
        "optimizer": "lamb",
        "label_smoothing": 0.05,
        "warmup_epochs": 0.5,
        "steps": 5,
        "run_id": "walk-vision",
    },
    "vision-jpeg": {  # the loader's settings: a real input pipeline (--synthetic has no loader)
        "model": "resnet-tiny",
        "loader_workers": 2,
        "pin_memory": False,
        "persistent_workers": False,
        "prefetch_factor": 2,
        "run_id": "walk-jpeg",
    },
    "llama-eks": {
        "model": "llama2-7b",
        "init": "pretrained",
        "weights": "meta-llama/Llama-2-7b-chat-hf",
        "epochs": 1,
        "target": "eks",
        "instance_type": "p4d.24xlarge",
        "image": "registry.example/trainkit:walk",
        "namespace": "walk-jobs",
        "nproc": 4,
        "reduce_dtype": "fp32",
        "sharding": "SHARD_GRAD_OP",
        "run_id": "walk-eks",
        "runs_dir": "walk-runs",  # on FSx: relative to the mount
        "eval_data": "org/dialogues-held-out",
        "eval_split": "test",
        "eval_interval": 100,
        "eval_batches": 5,
        "keep_best": False,
        "export_from": "last",
        "early_stop_patience": 3,
        "early_stop_delta": 0.01,
        "lora_rank": 16,
        "lora_alpha": 32.0,
        "lora_dropout": 0.05,
        "lora_targets": "q_proj,v_proj",
        "export": "merged",
        "track": "mlflow",
        "tracking_uri": "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/walk",
        "experiment": "walk",
    },
    "llama-sagemaker": {
        "model": "llama2-tiny",
        "target": "sagemaker",
        "spot": True,
        "max_runtime": 3600,
        "max_wait": 7200,
        "eval_fraction": 0.05,
        "run_id": "walk-sagemaker",
        "runs_dir": CHECKPOINTS,  # where SageMaker syncs the run folder; the only one it takes
    },
}
