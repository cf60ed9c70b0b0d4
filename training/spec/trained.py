"""What a job trains: its run, model, data and optimisation sections (the option schema, training/spec/)."""

from __future__ import annotations

from dataclasses import dataclass

from training import families
from training.families import text_families
from training.spec.options import DATA_FORMATS, PACKINGS, SYNTHETIC, TRUNCATIONS, WORKLOADS, option


@dataclass
class RunOptions:
    """Where the run lives and how it reports."""

    run_id: str | None = option(
        None, "Run directory name under --runs-dir; default: the model plus a hash of what is trained.", trains=False
    )
    runs_dir: str = option("runs", "Where runs live.", trains=False)
    seed: int = option(1234, "Seed for weights, data order and dropout.", minimum=0)
    log_interval: int = option(1, "Log metrics every N steps.", minimum=1, trains=False)
    metrics_port: int = option(
        9400,
        "Prometheus port of rank 0 (rank r serves on port + r); 0 disables.",
        minimum=0,
        maximum=65535,
        trains=False,
    )
    peak_tflops: float | None = option(
        None,
        "Peak TFLOP/s per device for MFU; default from the device table (no MFU on CPU without it).",
        above=0,
        trains=False,
    )
    profile: str = option("local", "Profile YAML the defaults came from.", trains=False, cli=False)
    workload: str = option(
        "recipe",
        "What the run starts: the model's recipe, a user's script, the collective sweep (nccl-test) or a data "
        "task; the model, data and optimisation fields describe a recipe only.",
        choices=WORKLOADS,
        trains=False,
        cli=False,
    )
    notes: list[str] = option(
        [], "Adjustments the launcher made to the defaults, shown to the user.", trains=False, cli=False
    )
    family_modules: list[str] = option(
        [],
        "Modules declaring model families of their own (training/families.py FAMILY_MODULES_ENV), imported by "
        "every reader of this spec before it reads the rest.",
        trains=False,
        cli=False,
    )


@dataclass
class ModelOptions:
    """What is trained, and from which weights."""

    name: str = option(
        "llama2-tiny",
        "The model: a registry name (training/registry.py), or a Hugging Face causal LM as a hub id, a local model "
        "folder or its config.json. The BERT models train with a byte tokenizer (one token per byte), not BERT's "
        "WordPiece: their losses are not comparable to the published ones.",
        flag="model",
    )
    family: str | None = option(
        None,
        "The model's family (training/families.py): which trainer runs the job (from the model registry or the "
        "model's config; a registered family's too, so its values are checked by `family_of`, not by choices).",
        trains=False,
        cli=False,
    )
    init: str = option(
        "random",
        "`random`: build from config, no download. `pretrained`: load weights from --weights.",
        choices=("random", "pretrained"),
    )
    weights: str | None = option(
        None,
        "Pretrained weights: a Hugging Face hub id or a local directory; default: the model's hub id.",
        family="decoder",
    )
    layers: int | None = option(
        None,
        "Truncate the model to this many layers (benchmarks and tests; labelled in every output).",
        minimum=1,
        family=text_families,
    )
    truncated_label: str | None = option(
        None, "Set when --layers truncates the model, so every output says so.", cli=False
    )


@dataclass
class DataOptions:
    """What the model reads."""

    dataset: str = option(
        SYNTHETIC,
        "`synthetic` (generated: dialogues for decoders, a text corpus for BERT, a 10-class JPEG tree for vision); "
        "for language models a local `.jsonl`, `.json` or `.parquet` file (BERT: also `.txt`), a folder of them, a "
        "folder saved with `datasets`, or a Hugging Face dataset name; for vision an ImageFolder root "
        "(train/<class>/, val/<class>/).",
        alias="data",
    )
    dataset_split: str = option("train", "Split to read from a Hugging Face dataset.")
    data_format: str | None = option(
        None,
        "Format of the records: `chat` ({messages: [{role, content}, ...]}, loss on assistant turns), `alpaca` "
        "(instruction, optional input, output), `prompt-response`, `dialogue-summary` (loss on the response or "
        "summary) or `text` (loss on every token; BERT reads only this); default: detected from the records.",
        choices=DATA_FORMATS,
        family=text_families,
    )
    packing: str | None = option(
        None,
        "Decoders: how examples share a packed sequence. `masked` (default): each example attends only to itself "
        "and its positions start at 0 (a block-diagonal mask built from per-example position ids); `concat`: "
        "examples attend across their boundaries (needed for --attention flash, whose kernel takes no mask).",
        choices=PACKINGS,
        family="decoder",
    )
    truncation: str | None = option(
        None,
        "Decoders, the supervised formats: an example longer than --seq-len (examples are packed whole, never "
        "split). `left` (default): its prompt loses tokens from the left (after <bos>) until it fits, or it is left "
        "out when its trained part alone does not fit; `drop`: it is left out. The start line counts both.",
        choices=TRUNCATIONS,
        family="decoder",
    )
    seq_len: int | None = option(
        None, "Tokens per packed sequence; at most the model's context length.", minimum=1, family=text_families
    )
    image_size: int | None = option(
        None,
        "Vision: training crop in pixels (validation resizes to size/0.875, centre-crops); default from the recipe.",
        minimum=1,
        family="vision",
    )
    synthetic: bool | None = option(
        None,
        "Vision: random tensors made on the device instead of images, to measure the compute ceiling.",
        family="vision",
        switch=True,
    )
    loader_workers: int | None = option(
        None,
        "Vision: data loader worker processes per training process (recipe: on GPUs the node's vCPUs / its "
        "processes, less 2, within 4-12; 1 on a CPU-only machine and for resnet-tiny).",
        minimum=0,
        family="vision",
        trains=False,
    )
    pin_memory: bool | None = option(
        None,
        "Vision: the loader hands batches over in page-locked host memory, copied to the GPU without blocking; "
        "default true on GPUs. Needs a GPU.",
        family="vision",
        trains=False,
    )
    persistent_workers: bool | None = option(
        None,
        "Vision: keep the loader's worker processes between passes (the evaluation loader's, every epoch); "
        "default true. Needs --loader-workers > 0.",
        family="vision",
        trains=False,
    )
    prefetch_factor: int | None = option(
        None,
        "Vision: batches each loader worker prepares ahead; default 4. Needs --loader-workers > 0.",
        minimum=1,
        family="vision",
        trains=False,
    )


@dataclass
class OptimisationOptions:
    """How long and how the model is optimised."""

    steps: int | None = option(
        None, "Optimizer steps to train; default from the model recipe unless --epochs is given.", minimum=1
    )
    epochs: int | None = option(None, "Passes over the packed dataset; alternative to --steps.", minimum=1)
    global_batch_size: int | None = option(
        None,
        "Sequences per optimizer step, all ranks together; default: the recipe's, rounded to a whole number per "
        "process (learning rate scaled to match).",
        minimum=1,
    )
    micro_batch_size: int | None = option(
        None,
        "Sequences per forward pass on one rank.",
        minimum=1,
        trains=False,  # how each rank's share of the global batch is split: the loss is the global batch's mean
    )
    global_batch_derived: bool = option(
        False,
        "Set when the launcher chose the global batch from the recipe for this world size; such a batch need not "
        "divide every size of an elastic range (ranks then get shares one apart).",
        trains=False,
        cli=False,
    )
    lr: float | None = option(None, "Peak learning rate.", above=0)
    lr_derived: bool = option(
        False,
        "Set when the launcher chose the learning rate (the recipe's, scaled with a derived global batch, or the "
        "vision rule's for the batch) rather than --lr.",
        trains=False,
        cli=False,
    )
    schedule: str = option(
        "cosine",
        "Learning-rate schedule after linear warmup: `cosine` (to 10% of the peak at the last step for decoders, "
        "to 0 for vision and BERT, as their references) or `constant`.",
        choices=("cosine", "constant"),
    )
    warmup_steps: int | None = option(None, "Linear warmup steps (or --warmup-epochs).", minimum=0)
    warmup_epochs: float | None = option(
        None, "Linear warmup in epochs (vision recipe: 5); alternative to --warmup-steps.", minimum=0, family="vision"
    )
    weight_decay: float | None = option(
        None,
        "Weight decay (decoders: AdamW, 0; BERT: LAMB, 0.01; vision: 1e-4; on matrices only for BERT and vision); "
        "default from the recipe.",
        minimum=0,
    )
    grad_clip: float | None = option(
        None,
        "Clip the global gradient norm to this value (0 disables); recipe: 1.0 for language models, 0 for vision.",
        minimum=0,
    )
    optimizer: str | None = option(
        None,
        "Vision: `sgd` (Nesterov momentum 0.9) or `lamb` (layer-wise adaptive, for large batches). BERT: `lamb` "
        "(the recipe's) or `adamw`. Llama fine-tuning uses AdamW.",
        choices=families.optimizer_choices,
        family=families.choosing_optimizers,
    )
    label_smoothing: float | None = option(
        None, "Vision: label smoothing of the cross-entropy loss (recipe: 0.1).", minimum=0, below=1, family="vision"
    )
