"""The training loop, in one place: one method per stage (load, step, log, save, export)."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate.utils import set_seed
from torch.distributed.fsdp import FSDPModule
from transformers.utils import logging as hf_logging

from training.common.distributed import make_accelerator, verify_sharding
from training.common.failure import doing
from training.common.flops import TransformerShape, mfu, peak_tflops_for_device
from training.common.job import MODEL_CONFIG, Job, data_source
from training.common.run import RunContext, current_nodes, peak_memory_bytes, synchronize
from training.common.sampling import StepSampler
from training.common.schedule import lr_multiplier

from . import fast_paths
from .data import IGNORE_INDEX, PackedDataset, load_records, tokenize_examples
from .model import DECODER_LAYER, build_model, consolidated_copy
from .tokenizer import load_tokenizer


class Trainer:
    def __init__(self, job: Job, run_dir: Path):
        self.job = job
        self.run_dir = run_dir
        set_seed(job.run.seed)
        self.nodes = current_nodes(job.parallelism.nodes)
        parallel = job.parallelism
        selective = bool(parallel.activation_checkpointing) and (parallel.ac_every or 1) > 1
        self.accelerator = acc = make_accelerator(
            parallel.sharding,
            parallel.precision,
            parallel.activation_checkpointing and not selective,  # selective: wrapped here, before prepare
            DECODER_LAYER,
            self.nodes,
            job.elastic.collective_timeout,
            parallel.reduce_dtype,
        )
        self.rank, self.world = acc.process_index, acc.num_processes
        pretrained = job.model.init == "pretrained"
        self.tokenizer = load_tokenizer(job.model.weights if pretrained else "byte")
        self.dataset, self.sampler = self._build_data()
        self.total_steps = job.optimisation.steps or job.optimisation.epochs * self.sampler.steps_per_epoch

        # Under FSDP only rank 0 builds real weights; the others get them, sharded, in prepare().
        model_config = None if pretrained else str(run_dir / MODEL_CONFIG)
        model = build_model(
            model_config, job.model.weights, job.run.seed, acc.is_main_process or job.parallelism.sharding == "NO_SHARD"
        )
        self.config = model.config
        if parallel.compile:  # in place, before checkpoint wrappers and FSDP2 wrap the layers
            fast_paths.compile_layers(model)
        if selective:
            fast_paths.checkpoint_every(model, parallel.ac_every)
        elif parallel.activation_checkpointing and parallel.sharding == "NO_SHARD":  # FSDP applies it in prepare
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        on_gpu = torch.cuda.is_available()
        fused = on_gpu if parallel.fused_adamw is None else parallel.fused_adamw
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=job.optimisation.lr,
            betas=(0.9, 0.95),
            weight_decay=job.optimisation.weight_decay,
            fused=fused or None,
            foreach=None if fused else True,
        )
        self.model, self.optimizer = acc.prepare(model, optimizer)
        fast_paths.schedule(self.model, parallel.prefetch or 0, parallel.reshard_last_layer is not False)
        self.fast_paths = fast_paths.taken(self.model, parallel.attention or "sdpa")
        self.fast_paths["optimizer_kernel"] = fast_paths.optimizer_kernel(self.optimizer)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer.optimizer,
            lambda step: lr_multiplier(
                step, job.optimisation.warmup_steps, self.total_steps, job.optimisation.schedule
            ),
        )
        acc.register_for_checkpointing(self.scheduler)
        shard_group = self.world // self.nodes if job.parallelism.sharding == "HYBRID_SHARD" else self.world
        self.sharding_report = verify_sharding(self.model, job.parallelism.sharding, self.world, shard_group)

        self.run = RunContext(acc, job, run_dir, self.nodes)
        self.flops_per_token = TransformerShape.from_hf_config(self.config).flops_per_token(job.data.seq_len)
        device_peak = peak_tflops_for_device(torch.cuda.get_device_name()) if on_gpu else None
        self.peak_tflops = job.run.peak_tflops or device_peak

    # ------------------------------------------------------------------ data

    def _build_data(self) -> tuple[PackedDataset, StepSampler]:
        job = self.job
        source = data_source(job, self.run_dir)
        with doing(f"reading dataset {source}"):
            ids, labels = tokenize_examples(load_records(source, job.data.dataset_split), self.tokenizer)
            dataset = PackedDataset.pack(ids, labels, job.data.seq_len)
        if dataset.dropped and self.accelerator.is_main_process:
            total = len(dataset) + dataset.dropped
            print(
                f"NOTE: {dataset.dropped} of {total} blocks of {job.data.seq_len} tokens are all prompt (no loss): "
                "left out",
                flush=True,
            )
        sampler = StepSampler(
            len(dataset),
            job.optimisation.global_batch_size,
            job.optimisation.micro_batch_size,
            self.rank,
            self.world,
            job.run.seed,
            hint="use more data, a smaller --global-batch-size or a shorter --seq-len",
        )
        return dataset, sampler

    # ------------------------------------------------------------------ stages

    def _gradient_sync_only_if(self, last_micro: bool):
        if isinstance(self.model, FSDPModule):
            self.model.set_requires_gradient_sync(last_micro)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if last_micro else self.accelerator.no_sync(self.model)

    def train_step(self, step: int) -> tuple[float, float, float, float]:
        """One optimizer step over the global batch; returns (mean loss, grad norm, input wait in s, optimizer
        time in s: clipping, the optimizer and scheduler steps, from the end of backward, the device synchronised
        at both ends, so the forward and backward time is the step's remainder)."""
        device = self.accelerator.device
        waited = time.perf_counter()
        micro = self.sampler.micro_batches(step)
        # A rank with a smaller share than others (an elastic job's global batch need not divide every
        # world size) may have an empty micro batch: it still runs the pass (FSDP's collectives need every
        # rank) on a stand-in sample whose loss counts zero.
        weights = [1.0 if len(indices) else 0.0 for indices in micro]
        micro = [indices if len(indices) else torch.zeros(1, dtype=torch.long) for indices in micro]
        batches = [(self.dataset.input_ids[i].to(device), self.dataset.labels[i].to(device)) for i in micro]
        data_wait = time.perf_counter() - waited
        # Normalise by the loss tokens of the whole global batch, so the loss and the gradient do
        # not depend on how the batch is split over ranks and accumulation steps.
        counted = torch.tensor(
            sum(int((y[:, 1:] != IGNORE_INDEX).sum()) for (_, y), w in zip(batches, weights, strict=True) if w),
            device=device,
        )
        dist.all_reduce(counted)
        scale = self.world / counted.clamp(min=1)
        loss_sum = torch.zeros((), device=device)
        # The attention kernel is pinned over forward and backward: a checkpointed layer recomputes its forward
        # in backward, and must pick the kernel it saved tensors for.
        kernel = self.job.parallelism.attention or "sdpa"
        for index, (inputs, labels) in enumerate(batches):
            with self._gradient_sync_only_if(index == len(batches) - 1), fast_paths.attention(kernel):
                logits = self.model(input_ids=inputs).logits
                token_loss = F.cross_entropy(
                    logits[:, :-1].flatten(0, 1).float(),
                    labels[:, 1:].flatten(),
                    ignore_index=IGNORE_INDEX,
                    reduction="sum",
                )
                self.accelerator.backward(token_loss * (scale * weights[index]))
            loss_sum += token_loss.detach() * weights[index]
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
        return (loss_sum / counted.clamp(min=1)).item(), float(grad_norm), data_wait, optimizer_s

    def log(
        self,
        step: int,
        loss: float,
        grad_norm: float,
        lr: float,
        step_time: float,
        data_wait: float,
        first: bool,
        optimizer_s: float | None = None,
    ):
        tokens = self.job.optimisation.global_batch_size * self.job.data.seq_len
        tokens_per_s = tokens / step_time
        record = {
            "step": step,
            "loss": loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens_per_s": tokens_per_s,
            "samples_per_s": self.job.optimisation.global_batch_size / step_time,
            "step_time_s": step_time,
            "data_wait_s": data_wait,
            "optimizer_s": optimizer_s,
            "mfu": mfu(tokens_per_s, self.flops_per_token, self.world, self.peak_tflops) if self.peak_tflops else None,
            "peak_memory_bytes": peak_memory_bytes(),
            "tokens_seen": step * tokens,
            "epoch": (step - 1) // self.sampler.steps_per_epoch,
            "warmup": first,  # first step after (re)start includes one-off setup costs
        }
        self.run.log_step(record)
        return record

    def export(self) -> Path | None:
        """Consolidate the sharded weights on rank 0 and write a Hugging Face model directory."""
        state_dict = self.accelerator.get_state_dict(self.model)
        target = self.run_dir / "model"
        if self.accelerator.is_main_process:
            tmp = self.run_dir / ".tmp-model"
            shutil.rmtree(tmp, ignore_errors=True)
            # One progress indicator per run (rank 0's steps): no second bar for the final model's shards.
            hf_logging.disable_progress_bar()
            consolidated_copy(self.config, state_dict).save_pretrained(tmp, safe_serialization=True)
            hf_logging.enable_progress_bar()
            self.tokenizer.save_pretrained(tmp)
            label = {"truncated": self.job.model.truncated_label, "run_id": self.job.run.run_id}
            (tmp / "trainkit.json").write_text(json.dumps(label, indent=2) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        self.accelerator.wait_for_everyone()
        return target

    # ------------------------------------------------------------------ driver

    def fit(self) -> None:
        job, acc, run = self.job, self.accelerator, self.run
        if run.already_finished(self.total_steps):
            return
        run.refuse_if_diverged()
        start = run.resume()
        if acc.is_main_process and job.model.truncated_label:
            print(f"NOTE: {job.model.truncated_label}", flush=True)
        bar = run.progress(start, self.total_steps)
        first = True
        for step in range(start, self.total_steps):
            lr = self.scheduler.get_last_lr()[0]
            run.profile.before(step + 1)
            started = time.perf_counter()
            loss, grad_norm, data_wait, optimizer_s = self.train_step(step)
            run.check_finite(step + 1, loss, grad_norm)
            elapsed = time.perf_counter() - started
            run.profile.after(step + 1)
            done = step + 1
            if done % job.run.log_interval == 0 or done == self.total_steps:
                record = self.log(done, loss, grad_norm, lr, elapsed, data_wait, first, optimizer_s)
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
            first = False
            bar.update(1)
            run.after_step(done, self.total_steps, job.checkpointing.checkpoint_interval)
        bar.close()
        run.save_final(self.total_steps)
        with doing(f"exporting the model to {self.run_dir / 'model'}"):
            exported = self.export()
        run.finish(
            start,
            {
                "truncated": job.model.truncated_label,
                "sharding": self.sharding_report,
                "fast_paths": self.fast_paths | {"graphs_compiled": fast_paths.compiled_graphs()},
                "hf_model_dir": str(exported) if exported else None,
                "peak_tflops": self.peak_tflops,
            },
        )
        acc.end_training()
