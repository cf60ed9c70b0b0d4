"""A model family added from this one module and nothing else (issue 51; CONTRIBUTING.md, "Add a model family"): an
MLP regression on generated data with its own trainer, launcher side, options and synthetic data. Named in
TRAINKIT_FAMILY_MODULES, it is an `invoke train --model mlp-tiny` like any other: in `--help`, trained on 2 local
processes, recorded in spec.json, and in the EKS, SageMaker and Batch dry runs.

The module is what a team writes for its own model kind: its FAMILY and MODELS at the top (the launcher and every
worker register them; importing the module, as pytest does, registers nothing), the launcher's side (`check_inputs`,
`prepare`), then the trainer, whose torch imports wait until a worker builds it (`trainer`), so the launcher stays
torch-free. The tests are at the end."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.aws_model import problems
from tests.helpers.product import invoke
from training.common.failure import SpecError
from training.common.files import publish_bytes
from training.families import FAMILY_MODULES_ENV, Family, Throughput
from training.registry import ModelEntry, Recipe
from training.spec import SYNTHETIC, Job, data_source, dataset_path
from training.spec.options import option

# ---------------------------------------------------------------------- the declarations


@dataclass
class MlpOptions:
    """The family's own options: `--hidden-units` and `--noise`, for its models only (spec.json section `mlp`)."""

    hidden_units: int = option(32, "MLP: units of the hidden layer.", minimum=1, maximum=4096)
    noise: float = option(0.05, "MLP: standard deviation of the synthetic targets' noise.", minimum=0)


FAMILY = MLP = Family(
    name="mlp",
    kind="MLP regression",
    trainer=f"{__name__}:trainer",
    text=False,
    shardings=("NO_SHARD",),
    optimizers=(),
    exports=False,
    random_init_only=True,
    data_flag="--data",
    data_files="an .npz file of arrays x, y, x_val and y_val",
    formats=(),
    synthetic=Path("data") / "regression.npz",
    synthetic_format=None,
    min_seq_len=(1, ""),
    full_micro_batches=True,
    throughput=Throughput(record="samples_per_s", progress="ex_s", metric="examples_per_s", unit="examples"),
    bench_reference=None,
    bench_input_pipeline=False,
    lr_rule="batch-sqrt",
    launch=__name__,
    eval_metric="eval_mse",
    lower_is_better=True,
    options=MlpOptions,
)


@dataclass(frozen=True)
class MlpArch:
    features: int
    parameters: int
    """What the launcher reads off a model of a family that is not trained on text: its size, for the disk check."""


FEATURES = 8
MODELS = (
    ModelEntry(
        name="mlp-tiny",
        family="mlp",
        arch=MlpArch(features=FEATURES, parameters=FEATURES * 32 + 32 + 32 + 1),
        recipe=Recipe(
            global_batch_size=32,
            micro_batch_size=8,
            sharding="NO_SHARD",
            weight_decay=0.0,
            grad_clip=1.0,
            checkpoint_interval=8,
            epochs=3,
            lr=0.01,
            warmup_steps=2,
        ),
        builder=f"{__name__}:build_model",
        notes="a family from one module (tests/e2e/test_family_from_one_module.py)",
    ),
)

# ---------------------------------------------------------------------- the launcher's side (torch-free)

EXAMPLES, HELD_OUT = 256, 64


def check_inputs(job: Job, entry) -> None:
    """A given --data is an .npz of the four arrays."""
    if job.data.dataset == SYNTHETIC:
        return
    path = Path(dataset_path(job)).expanduser()
    if path.suffix != ".npz" or not path.is_file():
        raise SpecError(f"--data {job.data.dataset}: give {MLP.data_files}, or synthetic")


def prepare(job: Job, entry) -> None:
    """`--dataset synthetic`: y = sin(x . w) + noise, the same for every rank (the run's seed)."""
    if job.data.dataset != SYNTHETIC:
        return
    import io

    import numpy as np

    rng = np.random.default_rng(job.run.seed)
    w = rng.normal(size=entry.arch.features) / np.sqrt(entry.arch.features)
    arrays = {}
    for name, count in (("", EXAMPLES), ("_val", HELD_OUT)):
        x = rng.normal(size=(count, entry.arch.features)).astype(np.float32)
        noise = rng.normal(scale=job.section("mlp").noise, size=count)
        arrays[f"x{name}"], arrays[f"y{name}"] = x, (np.sin(x @ w) + noise).astype(np.float32)[:, None]
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    publish_bytes(job.run_dir / MLP.synthetic, buffer.getvalue())


# ---------------------------------------------------------------------- the workers' side


def build_model(features: int, hidden: int):
    import torch

    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))


def trainer(job: Job, run_dir: Path):
    """The family's trainer (Family.trainer), made when a worker starts: torch and Accelerate are imported here."""
    import contextlib

    import numpy as np
    import torch
    import torch.distributed as dist
    from accelerate.utils import set_seed

    from training.common.distributed import make_accelerator
    from training.common.run import RunContext, current_nodes
    from training.common.sampling import StepSampler
    from training.common.trainer import Step, Trainer

    class MlpTrainer(Trainer):
        family = MLP

        def __init__(self, job: Job, run_dir: Path):
            super().__init__(job, run_dir)
            set_seed(job.run.seed)
            self.accelerator = acc = make_accelerator(
                "NO_SHARD", job.parallelism.precision, collective_timeout_s=job.elastic.collective_timeout
            )
            arrays = np.load(data_source(job, run_dir))
            self.x, self.y = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"])
            self.x_val, self.y_val = torch.from_numpy(arrays["x_val"]), torch.from_numpy(arrays["y_val"])
            o = job.optimisation
            rank, world = acc.process_index, acc.num_processes
            self.sampler = StepSampler(len(self.x), o.global_batch_size, o.micro_batch_size, rank, world, job.run.seed)
            self.steps_per_epoch = self.sampler.steps_per_epoch
            self.total_steps = o.steps or o.epochs * self.steps_per_epoch
            model = build_model(self.x.shape[1], job.section("mlp").hidden_units)
            optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)
            self.model, self.optimizer = acc.prepare(model, optimizer)
            self.scheduler = self.schedule(min(o.warmup_steps or 0, self.total_steps))
            self.run = RunContext(acc, job, run_dir, current_nodes(job.parallelism.nodes))

        def train_step(self, step: int) -> Step:
            """The mean squared error over the global batch: each micro batch's summed error over the global batch
            (times the world, which DDP's mean divides out), so the split does not change the gradient."""
            acc, batch = self.accelerator, self.job.optimisation.global_batch_size
            parts = self.sampler.micro_batches(step)
            total = torch.zeros(())
            for index, part in enumerate(parts):
                sync = index == len(parts) - 1
                with contextlib.nullcontext() if sync else acc.no_sync(self.model):
                    error = ((self.model(self.x[part]) - self.y[part]) ** 2).sum()
                    self.backward(error * acc.num_processes / batch)
                total += error.detach()
            grad_norm, optimizer_s = self.optimizer_tail()
            dist.all_reduce(total)
            return Step((total / batch).item(), grad_norm, 0.0, optimizer_s)

        def epoch_end(self, done: int) -> bool:
            return done % self.steps_per_epoch == 0

        def at_epoch_end(self, done: int) -> dict:
            with torch.no_grad():
                error = ((self.model(self.x_val) - self.y_val) ** 2).mean()
            return {MLP.eval_metric: error.item()}

    return MlpTrainer(job, run_dir)


# ---------------------------------------------------------------------- the tests

AS_FAMILY_MODULE = {FAMILY_MODULES_ENV: __name__}


def test_a_family_from_one_module_trains_on_two_processes_and_is_in_help_spec_and_every_dry_run(tmp_path):
    state = {"TRAINKIT_STATE_DIR": str(tmp_path / "state"), "KUBECONFIG": str(tmp_path / "none")}
    env = {**AS_FAMILY_MODULE, **state}
    shown = invoke("train", "--help", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "--hidden-units" in shown.stdout and "MLP: units of the hidden layer" in shown.stdout
    assert "mlp-tiny" in shown.stdout

    runs = tmp_path / "runs"
    common = ("--model", "mlp-tiny", "--runs-dir", str(runs), "--metrics-port", "0")
    done = invoke("train", *common, "--nproc", "2", "--hidden-units", "24", "--run-id", "mlp", env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    spec = json.loads((runs / "mlp" / "spec.json").read_text())
    assert spec["mlp"] == {"hidden_units": 24, "noise": 0.05} and spec["model"]["family"] == "mlp"
    assert spec["run"]["family_modules"] == [__name__]
    summary = json.loads((runs / "mlp" / "summary.json").read_text())
    assert summary["steps"] == 24 and summary["world_size"] == 2, summary
    records = [json.loads(line) for line in (runs / "mlp" / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r[MLP.eval_metric] for r in records if MLP.eval_metric in r]
    assert len(evaluated) == 3 and evaluated[-1] < evaluated[0], evaluated
    assert "ex_s=" in done.stdout, done.stdout[-2000:]

    cloud = ("--model", "mlp-tiny", "--nodes", "2", "--hidden-units", "24", "--dry-run")  # runs on the cloud's volume
    eks = invoke("train", *cloud, "--target", "eks", env=env)
    assert eks.returncode == 0, eks.stderr
    assert '\\"hidden_units\\": 24' in eks.stdout or '"hidden_units": 24' in eks.stdout, eks.stdout[-3000:]
    assert __name__ in eks.stdout
    sagemaker = invoke("train", *cloud, "--target", "sagemaker", env=env)
    assert sagemaker.returncode == 0, sagemaker.stderr
    request = json.loads(sagemaker.stdout)["request"]
    assert problems("sagemaker", "CreateTrainingJob", request) == []
    assert {"Name": "examples_per_s", "Regex": r"step \d+/\d+ \(\d+%\) .*ex_s=([0-9.]+)"} in request[
        "AlgorithmSpecification"
    ]["MetricDefinitions"]
    assert __name__ in sagemaker.stdout
    batch = invoke("train", *cloud, "--target", "batch", env=env)
    assert batch.returncode == 0, batch.stderr
    printed = json.loads(batch.stdout)
    assert problems("batch", "RegisterJobDefinition", printed["registerJobDefinition"]) == []
    assert problems("batch", "SubmitJob", printed["submitJob"]) == []
    assert __name__ in batch.stdout and "hidden_units" in batch.stdout


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--model", "llama2-tiny", "--hidden-units", "8"), "--hidden-units applies to MLP regression models"),
        (("--model", "mlp-tiny", "--hidden-units", "0"), "--hidden-units"),
        (("--model", "mlp-tiny", "--data", "nowhere.csv"), "--data nowhere.csv: give an .npz file"),
    ],
)
def test_its_options_are_checked_like_any_other(tmp_path, flags, said):
    done = invoke("train", *flags, "--runs-dir", str(tmp_path), "--dry-run", env=AS_FAMILY_MODULE)
    assert done.returncode == 2 and said in done.stderr, done.stderr
