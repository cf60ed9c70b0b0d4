"""BERT pretraining (masked language model), data-parallel: DeepSpeed ZeRO stage 1 (`--sharding ZERO_1`, the
reference's; training/common/zero.py) or DDP through Accelerate (NO_SHARD). The model from config, the corpus packed
once, masks drawn per step (training/encoder/masking.py), LAMB or AdamW; the loop around them is
`training.common.trainer.Trainer`'s."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate.utils import set_seed

from training.common import zero
from training.common.distributed import make_accelerator, resolve_precision, verify_sharding
from training.common.failure import doing
from training.common.flops import peak_tflops_for_device
from training.common.lamb import Lamb
from training.common.run import RunContext, current_nodes
from training.common.sampling import StepSampler
from training.common.sharded_lamb import PartitionLamb
from training.common.trainer import Step, Trainer, parameter_groups
from training.families import BERT
from training.registry import load, model_entry
from training.spec import MODEL_CONFIG, ZERO_1, Job, data_source
from training.text import dataset as text
from training.text.dataset import TextData

from .corpus import byte_tokenizer
from .masking import HELD_OUT_MASKS, IGNORE_INDEX, mask_tokens


class BertTrainer(Trainer):
    family = BERT

    def __init__(self, job: Job, run_dir: Path):
        super().__init__(job, run_dir)
        set_seed(job.run.seed)
        self.nodes = current_nodes(job.parallelism.nodes)
        parallel, o = job.parallelism, job.optimisation
        self.zero = parallel.sharding == ZERO_1
        # Under ZeRO-1 the Accelerator only sets up the processes and the device: DeepSpeed owns the precision.
        self.accelerator = acc = make_accelerator(
            "NO_SHARD",
            "fp32" if self.zero else parallel.precision,
            nodes=self.nodes,
            collective_timeout_s=job.elastic.collective_timeout,
        )
        self.rank, self.world = acc.process_index, acc.num_processes
        self.tokenizer = byte_tokenizer()
        self.special = torch.zeros(max(len(self.tokenizer), 1), dtype=torch.bool)
        self.special[self.tokenizer.all_special_ids] = True
        self.sequences, self.sampler = self._build_data()
        self.held_out = text.load_held_out(job, run_dir, self.tokenizer, self.sequences, self.rank, acc.is_main_process)
        self.steps_per_epoch = self.sampler.steps_per_epoch
        self.total_steps = o.steps or o.epochs * self.steps_per_epoch

        model = load(model_entry(job.model.name).builder)(str(run_dir / MODEL_CONFIG), job.run.seed)
        self.config = model.config
        if self.config.vocab_size < len(self.tokenizer):
            raise ValueError(
                f"{job.model.name}'s vocabulary ({self.config.vocab_size}) is smaller than the tokenizer's "
                f"({len(self.tokenizer)})"
            )
        groups = parameter_groups(model, o.weight_decay)
        lamb = PartitionLamb if self.zero else Lamb  # ZeRO-1 hands LAMB slices: trust ratios over whole norms
        if o.optimizer == "adamw":
            optimizer = torch.optim.AdamW(groups, lr=o.lr, betas=(0.9, 0.999), eps=1e-6)
        else:
            optimizer = lamb(groups, lr=o.lr, betas=(0.9, 0.999), eps=1e-6)
        state = None
        if self.zero:
            bf16 = resolve_precision(parallel.precision) == "bf16"
            config = zero.engine_config(o.micro_batch_size, self.sampler.micro_steps, o.grad_clip, bf16)
            self.model = self.engine = zero.initialize(model, optimizer, config)
            self.optimizer = self.engine.optimizer
            self.scheduler = self.schedule(min(o.warmup_steps or 0, self.total_steps))
            self.replication = zero.verify_partitioned(self.engine, self.world)
            state = zero.ZeroCheckpoint(self.engine, self.scheduler, self.world, self.rank)
        else:
            self.model, self.optimizer = acc.prepare(model, optimizer)
            self.scheduler = self.schedule(min(o.warmup_steps or 0, self.total_steps))
            self.replication = verify_sharding(self.model, "NO_SHARD", self.world, self.world)
        self.run = RunContext(acc, job, run_dir, self.nodes, state)
        self.run.start_fields["data"] = self.sequences.event()
        shape = model_entry(job.model.name).arch.truncated(job.model.layers).shape()
        self.flops_per_token = shape.flops_per_token(job.data.seq_len)
        on_gpu = torch.cuda.is_available()
        device_peak = peak_tflops_for_device(torch.cuda.get_device_name()) if on_gpu else None
        self.peak_tflops = job.run.peak_tflops or device_peak

    # ------------------------------------------------------------------ data

    def _build_data(self) -> tuple[TextData, StepSampler]:
        job = self.job
        with doing(f"reading corpus {data_source(job, self.run_dir)}"):
            sequences = text.load(job, self.run_dir, self.tokenizer, text.ENCODER, self.rank)
        if self.accelerator.is_main_process:
            print(sequences.said(), flush=True)
        sampler = StepSampler(
            len(sequences),
            job.optimisation.global_batch_size,
            job.optimisation.micro_batch_size,
            self.rank,
            self.world,
            job.run.seed,
            hint="use more text, a smaller --global-batch-size or a shorter --seq-len",
        )
        return sequences, sampler

    # ------------------------------------------------------------------ stages

    def evaluates(self) -> bool:
        return self.held_out is not None

    def evaluate(self) -> dict:
        """The masked-LM loss over the held-out sequences' chosen tokens, with masks fixed by the run's seed and each
        sequence's index (never a step's: two evaluations of the same weights give the same number), under ZeRO-1
        or DDP as the job trains (Trainer.held_out_loss)."""
        data, device = self.held_out, self.accelerator.device

        def batch(rows: torch.Tensor) -> tuple:
            inputs, labels = self._masked(data, rows, HELD_OUT_MASKS)
            return inputs.to(device), labels.to(device)

        return {"eval_loss": self.held_out_loss(len(data), batch, self._summed_loss, self._targets)}

    def _masked(self, data: TextData, indices: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokenizer = self.tokenizer
        return mask_tokens(
            data.rows("input_ids", indices),
            indices,
            seed=self.job.run.seed,
            step=step,
            special=self.special,
            mask_id=tokenizer.mask_token_id,
            vocab_size=len(tokenizer),
        )

    def _summed_loss(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=inputs).logits
        return F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )

    @staticmethod
    def _targets(labels: torch.Tensor) -> int:
        return int((labels != IGNORE_INDEX).sum())

    def train_step(self, step: int) -> Step:
        device = self.accelerator.device
        waited = time.perf_counter()
        micro = self.sampler.micro_batches(step)
        weights = [1.0 if len(indices) else 0.0 for indices in micro]
        micro = [indices if len(indices) else torch.zeros(1, dtype=torch.long) for indices in micro]
        batches = []
        for indices in micro:
            inputs, labels = self._masked(self.sequences, indices, step)
            batches.append((inputs.to(device), labels.to(device)))
        data_wait = time.perf_counter() - waited

        def around(last: bool):
            # DeepSpeed reduces at engine.step() only (managed_gradient_accumulation off); DDP at the last backward.
            return contextlib.nullcontext() if last or self.zero else self.accelerator.no_sync(self.model)

        return self.token_mean_step(batches, weights, self._targets, self._summed_loss, around, data_wait)

    def backward(self, loss: torch.Tensor) -> None:
        if self.zero:
            self.engine.backward(loss, scale_wrt_gas=False)  # the loss is already the global batch's token mean
        else:
            super().backward(loss)

    def optimizer_step(self) -> float:
        """ZeRO-1: the engine reduces the gradients, clips them (its `gradient_clipping`), steps this rank's partition,
        gathers the weights and clears the gradients; then the schedule steps."""
        if not self.zero:
            return super().optimizer_step()
        self.engine.step()
        self.scheduler.step()
        norm = self.engine.get_global_grad_norm() if self.job.optimisation.grad_clip > 0 else 0.0
        return float(norm or 0.0)

    def record(self, step: int, step_time: float) -> dict:
        return self.token_record(step_time, self.flops_per_token, self.peak_tflops)

    def report(self) -> dict:
        return {"samples": "sequences", "replication": self.replication, "peak_tflops": self.peak_tflops}
