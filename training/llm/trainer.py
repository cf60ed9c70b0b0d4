"""Decoder fine-tuning with Accelerate FSDP (Llama 2 or any Hugging Face causal LM the registry can size): the model,
the packed, tokenised-once data (training/text) and one optimizer step; the loop around them is
`training.common.trainer.Trainer`'s."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate.utils import set_seed
from torch.distributed.fsdp import FSDPModule
from transformers.utils import logging as hf_logging

from training.common.distributed import make_accelerator, resolve_precision, verify_sharding
from training.common.failure import doing
from training.common.faults import hang_here
from training.common.files import read_jsonl
from training.common.flops import peak_tflops_for_device
from training.common.run import RunContext, current_nodes
from training.common.sampling import StepSampler
from training.common.trainer import Step, Trainer, parameter_groups
from training.common.training_state import AdapterCheckpoint
from training.families import DECODER
from training.registry import DecoderArch
from training.spec import EXPORT_DIR, MERGED_DIR, MODEL_CONFIG, Job, data_source, weights_path
from training.text import dataset as text
from training.text.dataset import TextData
from training.text.formats import IGNORE_INDEX
from training.text.tokenizer import job_tokenizer_source, load_tokenizer, vocabulary_problem

from . import export, fast_paths, lora
from .model import build_model, consolidated_copy, decoder_layer_class, load_config


class DecoderTrainer(Trainer):
    family = DECODER
    LR_FLOOR = 0.1  # Llama 2 (Touvron et al. 2023, section 2.2): cosine decay to 10% of the peak

    def __init__(self, job: Job, run_dir: Path):
        super().__init__(job, run_dir)
        set_seed(job.run.seed)
        self.nodes = current_nodes(job.parallelism.nodes)
        parallel = job.parallelism
        selective = bool(parallel.activation_checkpointing) and (parallel.ac_every or 1) > 1
        # The weights' config, or the run's (random init: no weights): its model class names the decoder layer.
        weights = weights_path(job)  # where this machine reads them (an s3:// prefix: where the target mounted it)
        source = load_config(str(run_dir / MODEL_CONFIG), weights)
        layer_class = decoder_layer_class(source)
        self.accelerator = acc = make_accelerator(
            parallel.sharding,
            parallel.precision,
            parallel.activation_checkpointing and not selective,  # selective: wrapped here, before prepare
            layer_class,
            self.nodes,
            job.elastic.collective_timeout,
            parallel.reduce_dtype,
        )
        self.rank, self.world = acc.process_index, acc.num_processes
        pretrained = job.model.init == "pretrained"
        self.tokenizer_source = job_tokenizer_source(job)
        self.tokenizer = load_tokenizer(self.tokenizer_source)
        self.dataset, self.sampler = self._build_data()
        self.held_out = text.load_held_out(job, run_dir, self.tokenizer, self.dataset, self.rank, acc.is_main_process)
        self.steps_per_epoch = self.sampler.steps_per_epoch
        self.total_steps = job.optimisation.steps or job.optimisation.epochs * self.steps_per_epoch

        # Under FSDP only rank 0 builds real weights; the others get them, sharded, in prepare().
        model_config = None if pretrained else str(run_dir / MODEL_CONFIG)
        model = build_model(
            model_config, weights, job.run.seed, acc.is_main_process or job.parallelism.sharding == "NO_SHARD"
        )
        self.config = model.config
        # What the export keeps of a pretrained source (training/llm/export.py): its dtype and generation config.
        self.source_dtype = export.config_dtype(source) if pretrained else None
        self.source_generation = export.source_generation(weights if pretrained else None)
        problem = vocabulary_problem(len(self.tokenizer), self.config.vocab_size, self.tokenizer_source)
        if problem:
            raise ValueError(problem)
        self.lora_targets = self._adapt(model, layer_class) if job.lora.enabled else None
        if parallel.compile:  # in place, before checkpoint wrappers and FSDP2 wrap the layers
            fast_paths.compile_layers(model)
        if selective:
            fast_paths.checkpoint_every(model, parallel.ac_every)
        elif parallel.activation_checkpointing and parallel.sharding == "NO_SHARD":  # FSDP applies it in prepare
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        on_gpu = torch.cuda.is_available()
        fused = on_gpu if parallel.fused_adamw is None else parallel.fused_adamw
        # Decay on the weight matrices only: norm gains, biases and the token embeddings are exempt. With no decay
        # (the recipes' default) one group, as before: a run's optimizer state keeps its shape across this change.
        decay = job.optimisation.weight_decay
        params = parameter_groups(model, decay, embeddings=False) if decay else model.parameters()
        if self.lora_targets:  # the adapters only: no frozen weight reaches the optimizer (or a gradient reduction)
            params = [g for g in params if g["params"]] if decay else [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params,
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
        self.scheduler = self.schedule(job.optimisation.warmup_steps)
        shard_group = self.world // self.nodes if job.parallelism.sharding == "HYBRID_SHARD" else self.world
        self.sharding_report = verify_sharding(self.model, job.parallelism.sharding, self.world, shard_group)

        adapters = AdapterCheckpoint(acc, self.model, self.optimizer) if self.lora_targets else None
        self.run = RunContext(acc, job, run_dir, self.nodes, adapters)
        self.run.start_fields["data"] = self.dataset.event()
        trained = self.lora_trained if self.lora_targets else None  # LoRA: 4 FLOPs a frozen weight, not 6
        shape = DecoderArch.from_config(self.config.to_dict()).shape()
        self.flops_per_token = shape.flops_per_token(job.data.seq_len, adapter_params=trained)
        device_peak = peak_tflops_for_device(torch.cuda.get_device_name()) if on_gpu else None
        self.peak_tflops = job.run.peak_tflops or device_peak

    def _adapt(self, model: torch.nn.Module, layer_class: str) -> list[str]:
        """LoRA (training/llm/lora.py): adapters in place of the target layers, everything else frozen; under bf16
        the frozen weights are kept in bf16 (they are only ever read in the compute dtype), the adapters in fp32."""
        targets = lora.apply(model, self.job, layer_class)
        if resolve_precision(self.job.parallelism.precision) == "bf16":
            for parameter in model.parameters():
                if not parameter.requires_grad:
                    parameter.data = parameter.data.to(torch.bfloat16)
        trained, total = lora.counts(model)
        self.lora_trained = trained  # counted once: for this line and the FLOPs per token
        if self.accelerator.is_main_process:
            job = self.job
            print(
                f"LoRA rank {job.lora.rank}, alpha {job.lora.scale_alpha:g} on {', '.join(targets)}: {trained:,} of "
                f"{total:,} parameters trained ({trained / total:.2%}), the rest frozen",
                flush=True,
            )
        return targets

    # ------------------------------------------------------------------ data

    def _build_data(self) -> tuple[TextData, StepSampler]:
        job = self.job
        with doing(f"reading dataset {data_source(job, self.run_dir)}"):
            data = text.load(job, self.run_dir, self.tokenizer, text.DECODER, self.rank)
            if self.accelerator.is_main_process:
                print(data.said(), flush=True)
            sampler = StepSampler(  # too few packed sequences for a batch: the dataset's fault, said as such
                len(data),
                job.optimisation.global_batch_size,
                job.optimisation.micro_batch_size,
                self.rank,
                self.world,
                job.run.seed,
            )
        return data, sampler

    # ------------------------------------------------------------------ stages

    def _summed_loss(self, inputs: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        """The summed next-token loss of a micro batch's target tokens (training's and evaluation's)."""
        logits = self.model(input_ids=inputs, position_ids=positions).logits  # each predicts the next token
        return F.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(),
            labels[:, 1:].flatten(),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )

    def evaluates(self) -> bool:
        return self.held_out is not None

    def evaluate(self) -> dict:
        """Token-mean loss over the held-out rows' target tokens (those the training loss counts), and its
        perplexity, under the job's sharding (Trainer.held_out_loss)."""
        data, device = self.held_out, self.accelerator.device
        positions = "position_ids" if (self.job.data.packing or "masked") == "masked" else None

        def batch(rows: torch.Tensor) -> tuple:
            inputs, labels = (data.rows(name, rows).to(device) for name in ("input_ids", "labels"))
            return inputs, labels, data.rows(positions, rows).to(device) if positions else None

        with fast_paths.attention(self.job.parallelism.attention or "sdpa"):
            loss = self.held_out_loss(len(data), batch, self._summed_loss, self._targets)
        return {"eval_loss": loss, "eval_ppl": math.exp(min(loss, 700.0))}

    @staticmethod
    def _targets(labels: torch.Tensor) -> int:
        return int((labels[:, 1:] != IGNORE_INDEX).sum())

    def _gradient_sync_only_if(self, last_micro: bool):
        if isinstance(self.model, FSDPModule):
            self.model.set_requires_gradient_sync(last_micro)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if last_micro else self.accelerator.no_sync(self.model)

    def train_step(self, step: int) -> Step:
        device = self.accelerator.device
        waited = time.perf_counter()
        micro = self.sampler.micro_batches(step)
        # A rank with a smaller share than others (an elastic job's global batch need not divide every
        # world size) may have an empty micro batch: it still runs the pass (FSDP's collectives need every
        # rank) on a stand-in sample whose loss counts zero.
        weights = [1.0 if len(indices) else 0.0 for indices in micro]
        micro = [indices if len(indices) else torch.zeros(1, dtype=torch.long) for indices in micro]
        # --packing masked: each example's positions restart at 0, and the model masks attention at the restarts.
        positions = "position_ids" if (self.job.data.packing or "masked") == "masked" else None
        names = ("input_ids", "labels", positions)
        hang_here("data", step + 1)
        batches = [tuple(self.dataset.rows(name, i).to(device) if name else None for name in names) for i in micro]
        data_wait = time.perf_counter() - waited
        # The attention kernel is pinned over forward and backward: a checkpointed layer recomputes its forward
        # in backward, and must pick the kernel it saved tensors for.
        kernel = self.job.parallelism.attention or "sdpa"

        @contextlib.contextmanager
        def around(last: bool):
            with self._gradient_sync_only_if(last), fast_paths.attention(kernel):
                yield

        return self.token_mean_step(batches, weights, self._targets, self._summed_loss, around, data_wait)

    def record(self, step: int, step_time: float) -> dict:
        fields = self.token_record(step_time, self.flops_per_token, self.peak_tflops)
        return fields | {"tokens_seen": step * self.job.optimisation.global_batch_size * self.job.data.seq_len}

    def export(self) -> Path | None:
        """Consolidate the sharded weights on rank 0 and write a Hugging Face model directory; under LoRA, PEFT's
        adapter folder there, and with --export merged a full model with the adapters merged in (MERGED_DIR)."""
        state_dict = self.accelerator.get_state_dict(self.model)
        target = self.run_dir / EXPORT_DIR
        if self.accelerator.is_main_process:
            # One progress indicator per run (rank 0's steps): no second bar for the final model's shards.
            hf_logging.disable_progress_bar()
            dtype = export.export_dtype(resolve_precision(self.job.parallelism.precision), self.source_dtype)
            generation = export.generation_config(self.source_generation, self.config, self.tokenizer)
            if self.lora_targets:
                with self._publishing(target) as tmp:
                    lora.save_adapter(state_dict, tmp, self.job, self.lora_targets, dtype)
                    (tmp / "README.md").write_text(export.model_card(self._card(dtype) | {"adapter": self._adapter()}))
                if self.job.lora.export == "merged":
                    with self._publishing(self.run_dir / MERGED_DIR) as tmp:
                        source = build_model(None, weights_path(self.job), self.job.run.seed)  # fp32, as at the start
                        merged = lora.merge_into(source, state_dict, self.job)
                        export.save(merged, tmp, dtype, generation, self._card(dtype) | {"adapter": "merged in"})
            else:
                with self._publishing(target) as tmp:
                    export.save(consolidated_copy(self.config, state_dict), tmp, dtype, generation, self._card(dtype))
            hf_logging.enable_progress_bar()
        self.accelerator.wait_for_everyone()
        return target

    @contextlib.contextmanager
    def _publishing(self, target: Path):
        """A folder to write an export into, with the tokenizer and trainkit.json, that replaces `target` whole."""
        tmp = target.parent / f".tmp-{target.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        yield tmp
        self.tokenizer.save_pretrained(tmp)
        label = {"truncated": self.job.model.truncated_label, "run_id": self.job.run.run_id}
        (tmp / "trainkit.json").write_text(json.dumps(label, indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)

    def _adapter(self) -> str:
        lora_options = self.job.lora
        return (
            f"LoRA rank {lora_options.rank}, alpha {lora_options.scale_alpha:g}, on {', '.join(self.lora_targets)}; "
            f"load onto {self.job.model.weights} with peft.PeftModel.from_pretrained"
        )

    def _card(self, dtype: torch.dtype) -> dict:
        """The export's model card facts (training/llm/export.py)."""
        job, data = self.job, self.dataset.event()
        records = read_jsonl(self.run_dir / "metrics.jsonl")
        source = job.model.weights if job.model.init == "pretrained" else f"{job.model.name}, random init"
        packing = f", packing efficiency {data['efficiency']:.1%}" if "efficiency" in data else ""
        return {
            "run_id": job.run.run_id,
            "source": source,
            "architecture": (self.config.architectures or [self.config.model_type])[0],
            "data": f"{data_source(job, self.run_dir)} ({data['format']}, {data['records']} records, "
            f"{data['sequences']} sequences of {job.data.seq_len} tokens{packing})",
            "steps": f"{self.total_steps}, of {job.optimisation.global_batch_size} sequences each",
            "final loss": f"{records[-1]['loss']:.4f}" if records else None,
            "eval loss": self._card_evaluation(),
            "weights": str(dtype).removeprefix("torch."),
            "trainkit": export.trainkit_version(),
        }

    def _card_evaluation(self) -> str:
        which, step = self.export_source()
        evaluated = [r for r in read_jsonl(self.run_dir / "metrics.jsonl") if "eval_loss" in r and r["step"] == step]
        if not evaluated:
            return "not measured (no held-out data)" if self.best is None else f"not measured at step {step}"
        return f"{evaluated[-1]['eval_loss']:.4f} (held-out, the {which} checkpoint's, step {step})"

    # ------------------------------------------------------------------ around the loop

    def begin(self, start: int) -> None:
        if self.accelerator.is_main_process and self.job.model.truncated_label:
            print(f"NOTE: {self.job.model.truncated_label}", flush=True)

    def export_source(self) -> tuple[str, int]:
        """Which checkpoint the export is made from: (`best` or `last`, its step). --export-from best takes the best
        evaluation's checkpoint (kept by --keep-best); last, or best before any evaluation, the final one."""
        best = self.best
        if self.job.evaluation.export_from == "best" and best is not None and best.step is not None:
            return "best", best.step
        return "last", self.final_step

    def report(self) -> dict:
        which, step = self.export_source()
        if step != self.final_step:  # the final checkpoint is saved: the weights of the best go into the model
            self.run.load_checkpoint(step)
        with doing(f"exporting the model to {self.run_dir / 'model'}"):
            exported = self.export()
        if self.accelerator.is_main_process and step != self.final_step:
            print(f"exported the {which} checkpoint (step {step}) to {exported}", flush=True)
        return {
            "exported_from": {"checkpoint": which, "step": step},
            "truncated": self.job.model.truncated_label,
            "sharding": self.sharding_report,
            "fast_paths": self.fast_paths | {"graphs_compiled": fast_paths.compiled_graphs()},
            "lora": lora.held(self.model, self.optimizer) if self.lora_targets else None,
            "hf_model_dir": str(exported) if exported else None,
            "peak_tflops": self.peak_tflops,
            "data": self.dataset.event(),
        }
