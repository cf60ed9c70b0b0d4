"""Arguments of the ImageNet entry point. The launcher fills them from the job spec."""

from __future__ import annotations

from dataclasses import dataclass

OPTIMIZERS = ("sgd", "lamb")
PRECISIONS = ("auto", "bf16", "fp32")


@dataclass
class VisionConfig:
    """Accelerate DDP training of an image classifier on an ImageFolder tree (or synthetic device tensors)."""

    run_dir: str
    """Run directory: metrics.jsonl, summary.json and checkpoints/ are written here."""
    model_name: str
    """resnet50, efficientnet-b7 or resnet-tiny."""
    data: str | None = None
    """ImageFolder root with train/<class>/ and val/<class>/ (not used with --synthetic)."""
    synthetic: bool = False
    """Random tensors generated on the device instead of images: the compute ceiling without the input pipeline."""
    num_classes: int = 1000
    """Classes of the synthetic input (with --data the class folders decide)."""
    run_id: str = "run"
    """Label for metrics."""
    steps: int | None = None
    """Optimizer steps (or give epochs)."""
    epochs: int | None = None
    """Passes over train/ (or give steps)."""
    global_batch_size: int = 256
    """Images per optimizer step over all ranks."""
    micro_batch_size: int = 32
    """Images per forward pass per rank."""
    image_size: int = 224
    """Training crop in pixels; validation resizes to size/0.875 and centre-crops size."""
    optimizer: str = "sgd"
    """sgd (Nesterov momentum 0.9) or lamb (layer-wise adaptive, for large batches)."""
    lr: float = 0.1
    """Peak learning rate."""
    schedule: str = "cosine"
    """cosine (decays to 10% of peak) or constant, after linear warmup."""
    warmup_steps: int | None = None
    """Linear warmup in steps (or give warmup epochs)."""
    warmup_epochs: float = 0.0
    """Linear warmup in epochs of train/ (used when --warmup-steps is not given)."""
    weight_decay: float = 1e-4
    """Weight decay on conv and linear weights (biases and norms are exempt)."""
    label_smoothing: float = 0.1
    """Label smoothing of the cross-entropy loss."""
    grad_clip: float = 0.0
    """Max global gradient norm (0 disables)."""
    precision: str = "auto"
    """auto (bf16 autocast on capable GPUs, else fp32), bf16 or fp32."""
    loader_workers: int = 4
    """Data loader worker processes per training process."""
    nodes: int = 1
    """Nodes in the job (for the node metric label)."""
    checkpoint_interval: int = 0
    """Also save every N steps; a checkpoint is always written at the end of each epoch."""
    keep_checkpoints: int = 2
    """Published checkpoints to keep."""
    log_interval: int = 10
    """Log every N steps (and at every epoch end)."""
    seed: int = 1234
    """Seed for init, data order and augmentation."""
    metrics_port: int = 0
    """Prometheus port of local rank 0 (rank r serves port + r); 0 disables."""
    collective_timeout_s: float = 600.0
    """Seconds a collective may wait for a silent peer before this rank fails and the group restarts."""

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of --steps or --epochs")
        if self.synthetic == (self.data is not None):
            raise ValueError("give exactly one of --data <ImageFolder root> or --synthetic")
        if self.synthetic and self.epochs is not None:
            raise ValueError("--synthetic has no dataset to count epochs over; give --steps")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError("--schedule must be cosine or constant")
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError("--global-batch-size must be a multiple of --micro-batch-size")
