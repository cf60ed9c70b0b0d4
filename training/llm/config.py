"""Arguments of the Llama fine-tuning entry point. The launcher fills them from the job spec."""

from __future__ import annotations

from dataclasses import dataclass

STRATEGIES = ("FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP", "NO_SHARD")


@dataclass
class TrainConfig:
    """Accelerate FSDP fine-tuning of a Llama model on prompt/response data."""

    run_dir: str
    """Run directory: metrics.jsonl, summary.json, checkpoints/ and model/ are written here."""
    dataset: str
    """Local JSONL file, local dataset directory or Hugging Face dataset name."""
    model_config: str | None = None
    """config.json to build a randomly initialised model from (no download)."""
    weights: str | None = None
    """Pretrained weights: hub id or local directory (token from HF_TOKEN in the environment)."""
    tokenizer: str = "byte"
    """`byte` (built in, no download) or a hub id / local directory."""
    dataset_split: str = "train"
    """Split of a Hugging Face dataset."""
    run_id: str = "run"
    """Label for metrics."""
    model_name: str = "llama"
    """Label for metrics and summary."""
    truncated_label: str | None = None
    """Set when the model has fewer layers than published; repeated in every output."""
    steps: int | None = None
    """Optimizer steps (or give epochs)."""
    epochs: int | None = None
    """Passes over the packed dataset (or give steps)."""
    global_batch_size: int = 16
    """Sequences per optimizer step over all ranks."""
    micro_batch_size: int = 8
    """Sequences per forward pass per rank."""
    seq_len: int = 128
    """Tokens per packed sequence."""
    lr: float = 3e-4
    """Peak learning rate."""
    schedule: str = "cosine"
    """`cosine` (decays to 10% of peak) or `constant`, after linear warmup."""
    warmup_steps: int = 0
    """Linear warmup steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 disables)."""
    sharding: str = "FULL_SHARD"
    """FULL_SHARD, HYBRID_SHARD, SHARD_GRAD_OP or NO_SHARD."""
    nodes: int = 1
    """Nodes in the job (HYBRID_SHARD replicates across them)."""
    precision: str = "auto"
    """auto (bf16 on capable GPUs, else fp32), bf16 or fp32."""
    activation_checkpointing: bool = False
    """Recompute decoder-layer activations during backward."""
    checkpoint_interval: int = 0
    """Save every N steps (0: only at the end)."""
    keep_checkpoints: int = 2
    """Published checkpoints to keep."""
    log_interval: int = 1
    """Log every N steps."""
    seed: int = 1234
    """Seed for init, data order and dropout."""
    peak_tflops: float | None = None
    """Peak TFLOP/s per device for MFU (default from the device table; none on CPU)."""
    metrics_port: int = 0
    """Prometheus port of local rank 0 (rank r serves port + r); 0 disables."""
    collective_timeout_s: float = 600.0
    """Seconds a collective may wait for a silent peer before this rank fails and the group restarts."""
    export: bool = True
    """Export a consolidated Hugging Face model to run_dir/model at the end."""

    def __post_init__(self) -> None:
        if (self.model_config is None) == (self.weights is None):
            raise ValueError("give exactly one of --model-config (random init) or --weights (pretrained)")
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of --steps or --epochs")
        if self.sharding not in STRATEGIES:
            raise ValueError(f"--sharding must be one of {', '.join(STRATEGIES)}")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError("--schedule must be cosine or constant")
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError("--global-batch-size must be a multiple of --micro-batch-size")
