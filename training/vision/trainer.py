"""The ImageNet training loop: one method per stage (data, step, evaluate, log, save), DDP through Accelerate."""

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
from training.common.job import MODEL_CONFIG, Job, data_source
from training.common.run import RunContext, current_nodes, peak_memory_bytes, synchronize
from training.common.sampling import StepSampler, micro_steps
from training.common.schedule import lr_multiplier

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
from .lamb import Lamb
from .layout import check_image_folder
from .models import build_model, parameter_groups


def _step_seed(seed: int, step: int, rank: int) -> int:
    return seed * 7919 + step * 104_729 + rank


class VisionTrainer:
    def __init__(self, job: Job, run_dir: Path):
        self.job = job
        self.run_dir = run_dir
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
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer.optimizer,
            lambda step: lr_multiplier(step, self.warmup_steps, self.total_steps, job.optimisation.schedule),
        )
        acc.register_for_checkpointing(self.scheduler)
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

    def train_step(self, step: int, batches) -> tuple[float, float, float, float]:
        """One optimizer step over the global batch; returns (mean loss, grad norm, seconds waiting for data,
        optimizer seconds: clipping, the optimizer and scheduler steps, the device synchronised at both ends)."""
        waited = time.perf_counter()
        micro = [next(batches) for _ in range(self.micro_per_step)]
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
        synchronize()
        optimizer_started = time.perf_counter()
        grad_norm = torch.zeros(())
        if self.job.optimisation.grad_clip > 0:
            grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.job.optimisation.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        synchronize()
        optimizer_s = time.perf_counter() - optimizer_started
        dist.all_reduce(loss_sum)
        return (loss_sum / self.world).item(), float(grad_norm), data_wait, optimizer_s

    def _sync_buffers(self) -> None:
        """BatchNorm statistics from rank 0 on every rank, so evaluation and checkpoints agree."""
        for buffer in self.accelerator.unwrap_model(self.model).buffers():
            dist.broadcast(buffer, src=0)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Top-1 / top-5 over the whole val/ split (each image once across ranks)."""
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
        for images, labels in self.val_batches:
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
        return {
            "val_top1": float(totals[0]) / count,
            "val_top5": float(totals[1]) / count,
            "val_loss": float(totals[2]) / count,
            "val_images": int(totals[3]),
        }

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

    def log(
        self,
        step: int,
        loss: float,
        grad_norm: float,
        lr: float,
        step_time: float,
        data_wait: float,
        extra,
        optimizer_s: float | None = None,
    ):
        record = {
            "step": step,
            "epoch": (step - 1) // self.steps_per_epoch,
            "loss": loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "samples_per_s": self.job.optimisation.global_batch_size / step_time,
            "step_time_s": step_time,
            "data_wait_s": data_wait,
            "optimizer_s": optimizer_s,
            "peak_memory_bytes": peak_memory_bytes(),
            "samples_seen": step * self.job.optimisation.global_batch_size,
            **extra,
        }
        self.run.log_step(record)
        return record

    # ------------------------------------------------------------------ driver

    def fit(self) -> None:
        job, acc, run = self.job, self.accelerator, self.run
        if run.already_finished(self.total_steps):
            return
        run.refuse_if_diverged()
        start = run.resume()
        batches = self._micro_batches(start)
        bar = run.progress(start, self.total_steps)
        first, evaluation = True, {}
        epoch_started, epoch_whole = time.perf_counter(), start % self.steps_per_epoch == 0
        for step in range(start, self.total_steps):
            lr = self.scheduler.get_last_lr()[0]
            run.profile.before(step + 1)
            started = time.perf_counter()
            loss, grad_norm, data_wait, optimizer_s = self.train_step(step, batches)
            run.check_finite(step + 1, loss, grad_norm)
            elapsed = time.perf_counter() - started
            run.profile.after(step + 1)
            done = step + 1
            epoch_end = done % self.steps_per_epoch == 0 or done == self.total_steps
            extra: dict = {"warmup": first}
            if epoch_end and not job.data.synthetic:
                extra["epoch_time_s"] = time.perf_counter() - epoch_started if epoch_whole else None
                evaluation = self.evaluate()
                self.replica_digests()
                extra.update(evaluation)
            if done % job.run.log_interval == 0 or epoch_end:
                record = self.log(done, loss, grad_norm, lr, elapsed, data_wait, extra, optimizer_s)
                bar.set_postfix(loss=f"{loss:.4f}", img_s=f"{record['samples_per_s']:.0f}")
            first = False
            bar.update(1)
            run.after_step(done, self.total_steps, job.checkpointing.checkpoint_interval, save_anyway=epoch_end)
            if epoch_end:
                epoch_started, epoch_whole = time.perf_counter(), True
        bar.close()
        self._sync_buffers()
        run.save_final(self.total_steps)
        digests = self.replica_digests()
        run.finish(
            start,
            {
                "samples": "images",
                "classes": self.num_classes,
                "synthetic": job.data.synthetic,
                "replication": self.replication,
                "replica_digests": digests,
                "final_eval": evaluation or None,
                "optimizer": job.optimisation.optimizer,
                "precision": resolve_precision(job.parallelism.precision),
                "channels_last": self.memory_format == torch.channels_last,
                "fast_paths": self.fast_paths_taken(),
            },
        )
        acc.end_training()
