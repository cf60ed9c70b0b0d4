"""The model families: what each kind of model needs from trainkit, in one declaration per family (issue 51), as
torchtitan bundles a model's parts in one `TrainSpec` (torchtitan/protocols/train_spec.py). The launcher and the
workers ask a model's family (`family_of`, `FAMILIES`); nothing outside a family's own modules branches on a
family's name or keys a table by it (tests/unit/test_one_family_spec.py holds that).

Torch-free and import-light: the launcher reads it to check, plan and submit a job without PyTorch. What a family
runs is named "module:attribute" and imported only when used (training/registry.py `load`).

A family declared outside trainkit (a team's own model kind) is a module that holds a `FAMILY` (a Family) and its
`MODELS` (training/registry.py ModelEntry), named in FAMILY_MODULES_ENV: the launcher registers them before it reads
a flag, and spec.json records the module (`run.family_modules`) so that every worker and node registers them too.
Importing the module registers nothing by itself (CONTRIBUTING.md, "Add a model family";
tests/e2e/test_family_from_one_module.py is one).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, fields
from pathlib import Path

# A leaf: training/spec/ (the option schema) reads the families, so nothing here imports it. The sharding
# names are the schema's (SHARDING_CHOICES there; a unit test holds every family's to them).
FSDP2 = ("FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP", "NO_SHARD")


@dataclass(frozen=True)
class Throughput:
    """How a family counts its work, wherever a rate is shown or read."""

    record: str
    """The field of metrics.jsonl's step records and of summary.json (the trainers' `rate`)."""
    progress: str
    """Its key on the progress line (`tok_s=4301`), which SageMaker's metric definitions read."""
    metric: str
    """The SageMaker metric's name (trainkit/backends/sagemaker/request.py METRICS)."""
    unit: str
    """What one item is, in words and in the bench's results (`tokens`, `images`, `sequences`)."""


@dataclass(frozen=True)
class Family:
    """One model family: its trainer, what the launcher accepts for it, and how its work is counted."""

    name: str
    kind: str
    """How messages name its models ("BERT models")."""
    trainer: str
    """"module:Class" of its `training.common.trainer.Trainer` (training/__main__.py starts it)."""
    text: bool
    """Trained on tokenised text (a tokenizer, --seq-len, the text data path); else on images."""
    shardings: tuple[str, ...]
    """The --sharding values it trains with."""
    optimizers: tuple[str, ...]
    """The --optimizer values it accepts, its recipes' first (empty: the option is not its: AdamW always)."""
    exports: bool
    """It writes an exported model at the end (the export's bytes count in the disk check), beside the checkpoint."""
    random_init_only: bool
    """Trained from random weights only (--init pretrained is refused)."""
    data_flag: str
    """The flag its data comes in by (`--dataset`, `--data`)."""
    data_files: str
    """What a local dataset of it is, in words ("a JSONL, JSON or Parquet file")."""
    formats: tuple[str, ...]
    """The text formats it reads (training/text/formats.py; the unit tests hold them to it), none for images."""
    synthetic: Path
    """What `--dataset synthetic` generates, in the run folder (training/spec/ data_source)."""
    synthetic_format: str | None
    """The text format of those records (training/text/formats.py), None for images."""
    min_seq_len: tuple[int, str]
    """The shortest --seq-len a row of it can be, and why (`{model}`: the model's name)."""
    full_micro_batches: bool
    """Every rank needs a whole micro batch of items at every step (a global batch the launcher chose is refused
    when a rank would fall short; text rows are weighted instead)."""
    throughput: Throughput
    bench_reference: str | None
    """The bare loop `invoke bench train` holds it against ("module" run under torchrun), None where there is none."""
    bench_input_pipeline: bool
    """`invoke bench train` also runs it on on-device input (--synthetic) beside each pair, to price its input
    pipeline, and compares median steps (both sides read the same input); else it compares wall clock."""
    lr_rule: str
    """Where its learning rate comes from when --lr is not given: `batch-sqrt`, the recipe's rate moved by the
    square root of the global batch's change (trainkit/job/derive.py choose_global_batch); `optimizer`, its optimizer's
    scaling rule for the global batch (derive.py scaled_lr)."""
    launch: str
    """The module of its launcher side (torch-free: the launcher imports it, the workers never do), with any of:
    `check_inputs(job, entry)`, what can only be checked on this machine before anything is written (raises
    SpecError); `prepare(job, entry)`, what it writes into the run folder besides spec.json (its model config, its
    synthetic data); `notes(job, entry) -> list[str]`, what the launcher says at the start of every such job;
    `flops_per_item(job, model_config) -> float`, training FLOPs per counted item (`invoke bench train`'s MFU);
    `evaluates(job) -> bool`, whether a job of it has held-out data (default: --eval-data or --eval-fraction)."""
    eval_metric: str
    """The figure its evaluation reports, and which way is better (issue 52 picks the best checkpoint by it)."""
    lower_is_better: bool
    eval_metrics: tuple[str, ...] = ()
    """Every figure an evaluation of it reports (metrics.jsonl's fields, the eval line SageMaker's metrics read)."""
    options: type | None = None
    """Its own options beyond the shared schema's: a dataclass whose fields are declared with
    `training.spec.options.option`. They become `invoke train` flags for its models only, a section of spec.json
    named after the family, and `job.section(name)` in its trainer."""

    @property
    def fsdp2(self) -> bool:
        """Whether it shards with FSDP2 (all four strategies), or trains data-parallel (a few, named)."""
        return set(self.shardings) == set(FSDP2)


DECODER = Family(
    name="decoder",
    kind="decoder",
    trainer="training.llm.trainer:DecoderTrainer",
    text=True,
    shardings=FSDP2,
    optimizers=(),
    exports=True,
    random_init_only=False,
    data_flag="--dataset",
    data_files="a JSONL, JSON or Parquet file",
    formats=("chat", "alpaca", "prompt-response", "dialogue-summary", "text"),
    synthetic=Path("data") / "dialogues.jsonl",
    synthetic_format="dialogue-summary",
    min_seq_len=(1, ""),
    full_micro_batches=False,
    throughput=Throughput(record="tokens_per_s", progress="tok_s", metric="tokens_per_s", unit="tokens"),
    bench_reference="training.bench.reference",
    bench_input_pipeline=False,
    lr_rule="batch-sqrt",
    launch="training.llm.launch",
    eval_metric="eval_loss",
    lower_is_better=True,
    eval_metrics=("eval_loss", "eval_ppl"),
)
BERT = Family(
    name="bert",
    kind="BERT",
    trainer="training.encoder.trainer:BertTrainer",
    text=True,
    shardings=("ZERO_1", "NO_SHARD"),
    optimizers=("lamb", "adamw"),
    exports=False,
    random_init_only=True,
    data_flag="--dataset",
    data_files="a JSONL, JSON, Parquet or text file",
    formats=("text",),
    synthetic=Path("data") / "corpus.jsonl",
    synthetic_format="text",
    min_seq_len=(3, "a {model} row holds [CLS], at least one token and [SEP]"),
    full_micro_batches=False,
    throughput=Throughput(record="samples_per_s", progress="seq_s", metric="sequences_per_s", unit="sequences"),
    bench_reference=None,
    bench_input_pipeline=False,
    lr_rule="batch-sqrt",
    launch="training.encoder.launch",
    eval_metric="eval_loss",
    lower_is_better=True,
    eval_metrics=("eval_loss",),
)
VISION = Family(
    name="vision",
    kind="vision",
    trainer="training.vision.trainer:VisionTrainer",
    text=False,
    shardings=("NO_SHARD",),
    optimizers=("sgd", "lamb"),
    exports=False,
    random_init_only=True,
    data_flag="--data",
    data_files="an ImageFolder tree (train/<class>/, val/<class>/)",
    formats=(),
    synthetic=Path("data") / "imagenet",
    synthetic_format=None,
    min_seq_len=(1, ""),
    full_micro_batches=True,
    throughput=Throughput(record="samples_per_s", progress="img_s", metric="images_per_s", unit="images"),
    bench_reference="training.bench.vision_reference",
    bench_input_pipeline=True,
    lr_rule="optimizer",
    launch="training.vision.launch",
    eval_metric="val_top1",
    lower_is_better=False,
    eval_metrics=("val_top1", "val_top5", "val_loss"),
)


def launcher_hook(family: Family, name: str):
    """The function `name` of the family's launcher side, or None where it has none (Family.launch)."""
    return getattr(importlib.import_module(family.launch), name, None)


def optimizer_of(family: Family, given: str | None) -> str:
    """The optimizer a job of the family trains with: the one given, else its recipes' (AdamW where it has no
    choice)."""
    return given or (family.optimizers[0] if family.optimizers else "adamw")


FAMILIES: dict[str, Family] = {family.name: family for family in (DECODER, VISION, BERT)}
"""Every family by name: the registry's entries name theirs (training/registry.py `ModelEntry.family`); a family
module's `register` adds its own."""
FORMER_NAMES = {"llama": "decoder"}
"""A family's name in spec.json files written before it changed: the decoder family's before it took any Hugging
Face causal LM."""


def optimizer_choices() -> tuple[str, ...]:
    """Every --optimizer value some family accepts."""
    return tuple(dict.fromkeys(name for family in FAMILIES.values() for name in family.optimizers))


def choosing_optimizers() -> tuple[str, ...]:
    """The families whose models take --optimizer (the others train with AdamW)."""
    return tuple(name for name, family in FAMILIES.items() if family.optimizers)


def text_families() -> tuple[str, ...]:
    """The families an option of the text data path is for (training/spec/ `family=`): those trained on text, a
    registered one included."""
    return tuple(name for name, family in FAMILIES.items() if family.text)


FAMILY_MODULES_ENV = "TRAINKIT_FAMILY_MODULES"
"""Modules, comma-separated, that declare families and models of their own (importable where the launcher and the
workers run: the checkout's root on this machine; the training image on a cloud target)."""
LOADED: list[str] = []
"""The family modules imported so far, in order: what the launcher records in spec.json."""


def register(family: Family) -> Family:
    """Add a family declared outside this module (a family module's FAMILY, FAMILY_MODULES_ENV). Its name must be
    new and a Python identifier (it names its spec.json section); its options may not take another family's
    names (training/spec/ `all_fields` refuses a shared option's flag)."""
    if family.name in FAMILIES:
        if FAMILIES[family.name] == family:  # the same module imported again
            return family
        raise ValueError(f"model family {family.name!r} is declared twice; give the new one another name")
    if not family.name.isidentifier():
        raise ValueError(f"model family {family.name!r}: a family's name is a Python identifier (mlp, my_family)")
    if family.options is not None:
        own = {spec.name for spec in fields(family.options)}
        for other in FAMILIES.values():
            if other.options is not None and own & {spec.name for spec in fields(other.options)}:
                raise ValueError(f"model family {family.name!r}: an option of {other.name!r} has the same name")
    FAMILIES[family.name] = family
    return family


def load_family_modules(names: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Register the FAMILY and MODELS of each family module FAMILY_MODULES_ENV names, and of `names` (a run's
    spec.json), once each; returns every one loaded so far. One that does not import, or declares no Family, is a
    ValueError saying which and why."""
    from training.registry import register_model  # the registry reads this module: imported when first needed

    wanted = [name.strip() for name in os.environ.get(FAMILY_MODULES_ENV, "").split(",") if name.strip()]
    for name in (*wanted, *names):
        if name in LOADED:
            continue
        where = f"family module {name!r} ({FAMILY_MODULES_ENV} or the run's spec.json)"
        try:
            module = importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - any failure of a user's module is reported the same way
            raise ValueError(
                f"{where} does not import: {type(error).__name__}: {error}; it must be importable here (on "
                "PYTHONPATH, or in the image)"
            ) from None
        family = getattr(module, "FAMILY", None)
        if not isinstance(family, Family):
            raise ValueError(f"{where} has no FAMILY: declare its training.families.Family under that name")
        register(family)
        for entry in getattr(module, "MODELS", ()):
            family_of(entry.family)  # a ValueError naming the families there are
            register_model(entry)
        LOADED.append(name)
    return list(LOADED)


def family_of(name: str) -> Family:
    """A family by its name, as a model entry or spec.json names it."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; one of {', '.join(FAMILIES)}") from None
