"""ImageNet classification with Accelerate DDP: the model, the image pipeline, one optimizer step and the epoch's
evaluation; the loop around them is `training.common.trainer.Trainer`'s."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate.utils import set_seed

from training.common.distributed import make_accelerator, resolve_precision, verify_sharding
from training.common.lamb import Lamb
from training.common.run import RunContext, current_nodes
from training.common.sampling import StepSampler, micro_steps
from training.common.trainer import Step, Trainer
from training.families import VISION
from training.spec import MODEL_CONFIG, Job, data_source

from .data import (
    ClassFolder,
    LoaderSettings,
    SeededImages,
    synthetic_batch,
    train_loader,
    train_transform,
    val_loader,
    val_transform,
)
from .data import taken as loader_taken
from .layout import check_image_folder
from .models import build_model, parameter_groups, synced_batchnorm


def _step_seed(seed: int, step: int, rank: int) -> int:
    return seed * 7919 + step * 104_729 + rank


class VisionTrainer(Trainer):
    family = VISION

    def __init__(self, job: Job, run_dir: Path):
        super().__init__(job, run_dir)
        self.synthetic_classes = json.loads((run_dir / MODEL_CONFIG).read_text())["num_classes"]
        set_seed(job.run.seed)
        self.on_gpu = torch.cuda.is_available()
        self.accelerator = acc = make_accelerator(
            "NO_SHARD", job.parallelism.precision, collective_timeout_s=job.elastic.collective_timeout
        )
        self.rank, self.world = acc.process_index, acc.num_processes
        self.device = acc.device
        o = job.optimisation
        self.micro_per_step = micro_steps(o.global_batch_size, o.micro_batch_size, self.world)
        if o.global_batch_size // self.world < self.micro_per_step:  # an empty micro batch would upset BatchNorm
            raise ValueError(
                f"--global-batch-size {o.global_batch_size} leaves a rank of {self.world} fewer images than its "
                f"{self.micro_per_step} micro batches of {o.micro_batch_size}; use a multiple of "
                f"{o.micro_batch_size * self.world}"
            )
        self.loader_settings = LoaderSettings.of(job.data, self.on_gpu)
        self.forward_dtype: torch.dtype | None = None
        self.input_channels_last: bool | None = None  # the first batch the model saw, NHWC
        self.loader_report: dict | None = None  # the train loader's settings once it is made (none: --synthetic)
        if self.loader_settings.pin_memory and not self.on_gpu:
            raise ValueError("--pin-memory true pins host memory for copies to a GPU, and this process has none")
        self.classes = self._build_data()
        self.num_classes = len(self.classes) if self.classes else self.synthetic_classes
        self.total_steps = job.optimisation.steps or job.optimisation.epochs * self.sampler.steps_per_epoch
        warmup = job.optimisation.warmup_steps
        if warmup is None:
            warmup = round(job.optimisation.warmup_epochs * self.steps_per_epoch)
        self.warmup_steps = min(warmup, self.total_steps)

        model = build_model(job.model.name, self.num_classes)
        self.batchnorm = synced_batchnorm(model, o.micro_batch_size, self.world, self.device)
        channels_last = self.on_gpu if job.parallelism.channels_last is None else job.parallelism.channels_last
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        model = model.to(memory_format=self.memory_format)
        if job.data.synthetic:  # the on-device batch in the model's layout, as the loader's batches are copied
            images, labels = self.fixed_batch
            self.fixed_batch = (images.contiguous(memory_format=self.memory_format), labels)
        groups = parameter_groups(model, job.optimisation.weight_decay)
        if job.optimisation.optimizer == "lamb":
            optimizer = Lamb(groups, lr=job.optimisation.lr)
        else:
            optimizer = torch.optim.SGD(groups, lr=job.optimisation.lr, momentum=0.9, nesterov=True)
        self.model, self.optimizer = acc.prepare(model, optimizer)
        self.scheduler = self.schedule(self.warmup_steps)
        self.replication = verify_sharding(self.model, "NO_SHARD", self.world, self.world)
        # The dtype the first convolution computes in (bf16 under autocast) and its input's layout, seen once; the
        # logits cannot say: Accelerate hands them back in fp32 whatever the forward ran in.
        first_conv = next(m for m in self.model.modules() if isinstance(m, torch.nn.Conv2d))
        self._dtype_hook = first_conv.register_forward_hook(self._record_forward_dtype)
        self.run = RunContext(acc, job, run_dir, current_nodes(job.parallelism.nodes))

    # ------------------------------------------------------------------ data

    def _build_data(self) -> list[str] | None:
        job = self.job
        if job.data.synthetic:
            self.sampler = None
            self.steps_per_epoch = job.optimisation.steps  # no dataset: one "epoch" is the run
            self.fixed_batch = synthetic_batch(
                job.optimisation.micro_batch_size,
                job.data.image_size,
                self.synthetic_classes,
                self.device,
                job.run.seed + self.rank,
            )
            return None
        self.val_batches = None
        root = Path(data_source(job, self.run_dir))
        train = ClassFolder(
            str(root / "train"), classes=check_image_folder(root), transform=train_transform(job.data.image_size)
        )
        self.train_images = SeededImages(train, job.run.seed)
        self.val_images = ClassFolder(
            str(root / "val"), classes=train.classes, transform=val_transform(job.data.image_size)
        )
        self.sampler = StepSampler(
            len(train),
            job.optimisation.global_batch_size,
            job.optimisation.micro_batch_size,
            self.rank,
            self.world,
            job.run.seed,
        )
        self.steps_per_epoch = self.sampler.steps_per_epoch
        return train.classes

    def _micro_batches(self, start: int):
        """Yields the micro batches of each step from `start` on, as tensors on the device."""
        if self.job.data.synthetic:
            while True:
                yield self.fixed_batch
        loader = train_loader(self.train_images, self.sampler, start, self.total_steps, self.loader_settings)
        self.loader_report = loader_taken(loader)
        for images, labels in loader:
            yield (
                images.to(self.device, non_blocking=True, memory_format=self.memory_format),
                labels.to(self.device, non_blocking=True),
            )

    # ------------------------------------------------------------------ stages

    def train_step(self, step: int) -> Step:
        if self.epoch_started is None:
            self.epoch_started = time.perf_counter()
        waited = time.perf_counter()
        micro = [next(self.batches) for _ in range(self.micro_per_step)]
        data_wait = time.perf_counter() - waited
        torch.manual_seed(_step_seed(self.job.run.seed, step, self.rank))  # dropout, stochastic depth
        self.model.train()
        loss_sum = torch.zeros((), device=self.device)
        # Summed over images and scaled by world / global batch: after DDP's mean over ranks, the gradient
        # of the global batch's mean loss, however the batch is split over ranks and micro batches.
        scale = self.world / self.job.optimisation.global_batch_size
        for index, (images, labels) in enumerate(micro):
            last = index == len(micro) - 1
            with contextlib.nullcontext() if last else self.accelerator.no_sync(self.model):
                logits = self.model(images)
                loss = F.cross_entropy(
                    logits.float(), labels, label_smoothing=self.job.optimisation.label_smoothing, reduction="sum"
                )
                self.accelerator.backward(loss * scale)
            loss_sum += loss.detach() * scale
        grad_norm, optimizer_s = self.optimizer_tail()
        dist.all_reduce(loss_sum)
        return Step((loss_sum / self.world).item(), grad_norm, data_wait, optimizer_s)

    def _sync_buffers(self) -> None:
        """BatchNorm statistics from rank 0 on every rank, so evaluation and checkpoints agree."""
        for buffer in self.accelerator.unwrap_model(self.model).buffers():
            dist.broadcast(buffer, src=0)

    def evaluates(self) -> bool:
        """Whether it has a val/ split to evaluate on (--synthetic has no images at all)."""
        return not self.job.data.synthetic

    def eval_due(self, done: int) -> bool:
        """At the end of every epoch (and the last step), or every --eval-interval steps and the last; never with
        --eval-interval 0."""
        if self.job.evaluation.interval is None:
            return self.evaluates() and self.epoch_end(done)
        return super().eval_due(done)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Top-1 / top-5 over the whole val/ split (each image once across ranks), or over each rank's first
        --eval-batches micro batches of it."""
        self._sync_buffers()
        self.model.eval()
        totals = torch.zeros(4, device=self.device, dtype=torch.float64)  # top1, top5, loss sum, count
        if self.val_batches is None:  # made once: its workers serve every epoch's evaluation
            self.val_batches = val_loader(
                self.val_images,
                self.rank,
                self.world,
                self.job.optimisation.micro_batch_size,
                self.loader_settings,
            )
        k = min(5, len(self.classes))
        limit = self.job.evaluation.batches
        for index, (images, labels) in enumerate(self.val_batches):
            if limit and index == limit:
                break
            images = images.to(self.device, non_blocking=True, memory_format=self.memory_format)
            labels = labels.to(self.device, non_blocking=True)
            logits = self.model(images).float()
            top = logits.topk(k, dim=1).indices
            totals[0] += (top[:, 0] == labels).sum()
            totals[1] += (top == labels[:, None]).any(dim=1).sum()
            totals[2] += F.cross_entropy(logits, labels, reduction="sum")
            totals[3] += labels.numel()
        dist.all_reduce(totals)
        count = max(1.0, float(totals[3]))
        self.model.train()
        self.evaluation = {
            "val_top1": float(totals[0]) / count,
            "val_top5": float(totals[1]) / count,
            "val_loss": float(totals[2]) / count,
            "val_images": int(totals[3]),
        }
        return self.evaluation

    def _record_forward_dtype(self, _module, inputs: tuple, output: torch.Tensor) -> None:
        self.forward_dtype = output.dtype
        images = inputs[0]
        nhwc = images.is_contiguous(memory_format=torch.channels_last)
        self.input_channels_last = nhwc and not images.is_contiguous()
        self._dtype_hook.remove()

    def fast_paths_taken(self) -> dict:
        """What the run actually ran with, read back from the model, a forward pass and the loader, not the flags:
        the weights' memory format, the dtype the forward computed in (bf16 under autocast), the loader's settings."""
        convs = [m.weight for m in self.model.modules() if isinstance(m, torch.nn.Conv2d)]
        # A 1x1 kernel's weight is both NCHW- and NHWC-contiguous: channels last when every weight is NHWC and
        # some, then, not NCHW.
        nhwc = [w.is_contiguous(memory_format=torch.channels_last) for w in convs]
        return {
            "channels_last": bool(nhwc) and all(nhwc) and not all(w.is_contiguous() for w in convs),
            "input_channels_last": self.input_channels_last,
            "forward_dtype": str(self.forward_dtype).removeprefix("torch.") if self.forward_dtype else None,
            "loader": self.loader_report,
        }

    def replica_digests(self) -> list[str]:
        """A digest of every rank's parameters; DDP keeps the replicas bit-identical, or the job stops."""
        mine = torch.stack([p.detach().double().sum() for p in self.model.parameters()]).cpu()
        gathered = [torch.empty_like(mine, device=self.device) for _ in range(self.world)]
        dist.all_gather(gathered, mine.to(self.device))
        digests = [hashlib.sha256(g.cpu().numpy().tobytes()).hexdigest()[:16] for g in gathered]
        if len(set(digests)) != 1:
            raise RuntimeError(f"data-parallel replicas hold different weights ({digests}): gradients are not averaged")
        return digests

    # ------------------------------------------------------------------ around the loop

    def begin(self, start: int) -> None:
        self.batches = self._micro_batches(start)
        # An epoch's time is measured only when this process ran all of it; it starts with the epoch's first step.
        self.epoch_started, self.epoch_whole = None, start % self.steps_per_epoch == 0
        self.evaluation: dict = {}  # the last epoch's, reported at the end

    def epoch_end(self, done: int) -> bool:
        return done % self.steps_per_epoch == 0 or done == self.total_steps

    def at_epoch_end(self, done: int) -> dict:
        if self.job.data.synthetic:
            return {}
        fields = {"epoch_time_s": time.perf_counter() - self.epoch_started if self.epoch_whole else None}
        self.replica_digests()
        self.epoch_started, self.epoch_whole = None, True
        return fields

    def record(self, step: int, step_time: float) -> dict:
        return {"samples_seen": step * self.job.optimisation.global_batch_size}

    def before_final_save(self) -> None:
        self._sync_buffers()

    def report(self) -> dict:
        digests = self.replica_digests()
        return {
            "samples": "images",
            "classes": self.num_classes,
            "synthetic": self.job.data.synthetic,
            "replication": self.replication,
            "batchnorm": self.batchnorm or "per rank",
            "replica_digests": digests,
            "final_eval": self.evaluation or None,
            "optimizer": self.job.optimisation.optimizer,
            "precision": resolve_precision(self.job.parallelism.precision),
            "channels_last": self.memory_format == torch.channels_last,
            "fast_paths": self.fast_paths_taken(),
        }
