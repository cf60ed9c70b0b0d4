"""The training loop every family shares (decoder, BERT, vision): load, step, log, save, evaluate, finish. A
family's trainer builds its model, data, optimizer and `RunContext` in `__init__` and supplies one optimizer step
over the global batch; everything around that step (resuming, the progress line, finite checks, metrics records,
checkpoints, the stop file, the final save and the report) happens here, in one order for every model."""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator

from training.common.best import BestSoFar
from training.common.checkpoint import step_dir_name
from training.common.distributed import peak_memory_bytes, synchronize
from training.common.faults import hang_here
from training.common.flops import mfu
from training.common.progress import eval_line
from training.common.run import RunContext
from training.common.schedule import lr_multiplier
from training.families import Family
from training.spec import Job


@dataclass(frozen=True)
class Step:
    """What one optimizer step measured: the global batch's mean loss, the gradient norm before clipping (0 when
    clipping is off), seconds waiting for data and seconds in the optimizer tail."""

    loss: float
    grad_norm: float
    data_wait_s: float
    optimizer_s: float


class Trainer(abc.ABC):
    """The loop; a family's subclass sets `accelerator`, `model`, `optimizer`, `scheduler`, `run`, `total_steps`
    and `steps_per_epoch` in its `__init__`, and implements `train_step`."""

    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    run: RunContext
    total_steps: int
    steps_per_epoch: int
    family: Family
    """The trainer's family (training/families.py): its throughput's record field and progress-line name."""
    LR_FLOOR: float = 0.0
    """Where the cosine schedule ends, as a share of the peak learning rate: the family's reference's (vision:
    torchvision's reference scripts, CosineAnnealingLR to `--lr-min` 0; BERT: Devlin et al. 2018 decay linearly
    to 0)."""

    def __init__(self, job: Job, run_dir: Path):
        self.job = job
        self.run_dir = run_dir

    # ------------------------------------------------------------------ what a family supplies

    @abc.abstractmethod
    def train_step(self, step: int) -> Step:
        """One optimizer step (0-based `step`) over the global batch; ends with `optimizer_tail()`."""

    def begin(self, start: int) -> None:  # noqa: B027 - an optional hook: most families need nothing here
        """Before the first step of this process, resuming at `start` (e.g. open the data loader there)."""

    def epoch_end(self, done: int) -> bool:
        """Whether `done` steps close an epoch: the loop then logs, evaluates and checkpoints."""
        return False

    def at_epoch_end(self, done: int) -> dict:
        """Fields for the record of an epoch's last step (an evaluation)."""
        return {}

    def record(self, step: int, step_time: float) -> dict:
        """The family's own fields of a step's metrics record."""
        return {}

    def evaluates(self) -> bool:
        """Whether the run has held-out data to evaluate on (`evaluate` is called at `eval_due` steps)."""
        return False

    def evaluate(self) -> dict:
        """The family's figures on its held-out data now (metrics.jsonl's `eval_*` fields)."""
        return {}

    def before_final_save(self) -> None:  # noqa: B027 - an optional hook
        """After the last step, before the final checkpoint."""

    def report(self) -> dict:
        """The family's fields of the run's report, after the final checkpoint (e.g. export the model)."""
        return {}

    # ------------------------------------------------------------------ shared stages

    def eval_due(self, done: int) -> bool:
        """Whether to evaluate after step `done`: every --eval-interval steps and after the last; without the flag at
        every checkpoint and after the last; never with --eval-interval 0 or no held-out data."""
        if not self.evaluates():
            return False
        interval = self.job.evaluation.interval
        if interval is None:
            interval = self.job.checkpointing.checkpoint_interval
        elif interval == 0:
            return False
        return done == self.total_steps or (bool(interval) and done % interval == 0)

    def token_mean_step(
        self,
        batches: list[tuple[torch.Tensor | None, ...]],
        weights: list[float],
        targets: Callable[[torch.Tensor], int],
        summed_loss: Callable[..., torch.Tensor],
        around: Callable[[bool], contextlib.AbstractContextManager],
        data_wait: float,
    ) -> Step:
        """One optimizer step of a text model over its micro batches (inputs, labels, and whatever else the model
        takes, such as position ids: `summed_loss(*batch)`): the loss is the mean over
        the global batch's target tokens (`targets(labels)` counts a micro batch's, `summed_loss` sums its token
        losses), so neither the loss nor the gradient depends on how the batch is split over ranks and
        accumulation steps. A micro batch of weight 0 (a rank's empty share, run on a stand-in so every rank
        takes part in the collectives) counts nothing. `around(last)` is the context of each forward and
        backward: gradient sync on the last micro batch only."""
        device = self.accelerator.device
        counted = torch.tensor(
            sum(targets(batch[1]) for batch, weight in zip(batches, weights, strict=True) if weight),
            device=device,
        )
        dist.all_reduce(counted)
        scale = self.accelerator.num_processes / counted.clamp(min=1)
        loss_sum = torch.zeros((), device=device)
        for index, batch in enumerate(batches):
            with around(index == len(batches) - 1):
                token_loss = summed_loss(*batch)
                self.backward(token_loss * (scale * weights[index]))
            loss_sum += token_loss.detach() * weights[index]
        grad_norm, optimizer_s = self.optimizer_tail()
        dist.all_reduce(loss_sum)
        return Step((loss_sum / counted.clamp(min=1)).item(), grad_norm, data_wait, optimizer_s)

    def held_out_loss(
        self,
        rows: int,
        batch: Callable[[torch.Tensor], tuple],
        summed_loss: Callable[..., torch.Tensor],
        targets: Callable[[torch.Tensor], int],
    ) -> float:
        """A text model's token-mean loss over `rows` held-out rows (at most --eval-batches batches of a micro batch
        per rank): the rows dealt round the ranks, each micro batch's summed loss (`summed_loss(*batch(indices))`)
        and target count (`targets(labels)`, labels second in the batch) added in float64 and reduced once, so the
        figure does not depend on the world size. Every rank runs every forward (a short one on a stand-in row that
        counts nothing), as the sharded model's collectives need. Eval mode, no gradients; no random state is drawn."""
        micro = self.job.optimisation.micro_batch_size
        per_batch = micro * self.accelerator.num_processes
        batches = -(-rows // per_batch)
        if self.job.evaluation.batches:
            batches = min(batches, self.job.evaluation.batches)
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        mine = list(torch.arange(rank, min(rows, batches * per_batch), world).split(micro))
        mine += [torch.zeros(0, dtype=torch.long)] * (batches - len(mine))
        sums = torch.zeros(2, dtype=torch.float64, device=self.accelerator.device)
        self.model.eval()
        with torch.no_grad():
            for indices in mine:
                tensors = batch(indices if len(indices) else torch.zeros(1, dtype=torch.long))
                loss = summed_loss(*tensors)
                if len(indices):
                    sums += torch.stack([loss.double(), torch.tensor(float(targets(tensors[1])), device=sums.device)])
        self.model.train()
        dist.all_reduce(sums)
        return float(sums[0] / sums[1].clamp(min=1))

    def token_record(self, step_time: float, flops_per_token: float, peak_tflops: float | None) -> dict:
        """A text model's throughput fields: tokens/s of the global batch and, where a peak is known, MFU."""
        tokens_per_s = self.job.optimisation.global_batch_size * self.job.data.seq_len / step_time
        world = self.accelerator.num_processes
        return {
            "tokens_per_s": tokens_per_s,
            "mfu": mfu(tokens_per_s, flops_per_token, world, peak_tflops) if peak_tflops else None,
        }

    def backward(self, loss: torch.Tensor) -> None:
        """One micro batch's backward (a DeepSpeed engine runs its own)."""
        self.accelerator.backward(loss)

    def schedule(self, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
        """The learning-rate schedule over `total_steps`, saved with every checkpoint."""
        o = self.job.optimisation
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer.optimizer,
            lambda step: lr_multiplier(step, warmup_steps, self.total_steps, o.schedule, self.LR_FLOOR),
        )
        self.accelerator.register_for_checkpointing(scheduler)
        return scheduler

    def optimizer_tail(self) -> tuple[float, float]:
        """Clip, step the optimizer and the schedule, clear the gradients; returns (grad norm, seconds), the device
        synchronised at both ends so the forward and backward time is the step's remainder."""
        synchronize()
        started = time.perf_counter()
        grad_norm = self.optimizer_step()
        synchronize()
        return grad_norm, time.perf_counter() - started

    def optimizer_step(self) -> float:
        """Clip, step the optimizer and the schedule, clear the gradients; the gradient norm before clipping (0 when
        clipping is off). A DeepSpeed engine does the first three itself."""
        grad_norm = torch.zeros(())
        if self.job.optimisation.grad_clip > 0:
            grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.job.optimisation.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm)

    def log(self, step: int, result: Step, lr: float, step_time: float, extra: dict) -> dict:
        batch = self.job.optimisation.global_batch_size
        record = {
            "step": step,
            "epoch": (step - 1) // self.steps_per_epoch,
            "loss": result.loss,
            "lr": lr,
            "grad_norm": result.grad_norm,
            "samples_per_s": batch / step_time,
            "step_time_s": step_time,
            "data_wait_s": result.data_wait_s,
            "optimizer_s": result.optimizer_s,
            "peak_memory_bytes": peak_memory_bytes(),
            **self.record(step, step_time),
            **extra,
        }
        self.run.log_step(record)
        return record

    # ------------------------------------------------------------------ driver

    def fit(self) -> None:
        job, run = self.job, self.run
        if run.already_finished(self.total_steps):
            return
        run.refuse_if_diverged()
        start = run.resume()
        self.best = self._best_so_far(run.resumed_state.get("evaluation"))
        self.begin(start)
        bar = run.progress(start, self.total_steps)
        field, short = self.family.throughput.record, self.family.throughput.progress
        first, self.final_step = True, self.total_steps
        if run.resumed_state.get("stopped_early") == start:  # it stopped early, then failed before its summary
            self.final_step = start
        for step in range(start, self.final_step):
            lr = self.scheduler.get_last_lr()[0]
            run.profile.before(step + 1)
            started = time.perf_counter()
            hang_here("step", step + 1)
            result = self.train_step(step)
            run.check_finite(step + 1, result.loss, result.grad_norm)
            elapsed = time.perf_counter() - started
            run.profile.after(step + 1)
            done = step + 1
            epoch_end = self.epoch_end(done)
            if epoch_end:
                with run.heartbeat.phase("evaluate"):
                    extra = {"warmup": first} | self.at_epoch_end(done)
            else:
                extra = {"warmup": first}
            evaluated = self.eval_due(done)
            keep = False
            if evaluated:
                figures, keep = self._evaluate_at(done, bar)
                extra |= figures
            stop_early = self._patience_ran_out()
            if done % job.run.log_interval == 0 or done == self.total_steps or epoch_end or evaluated:
                record = self.log(done, result, lr, elapsed, extra)
                bar.set_postfix(loss=f"{result.loss:.4f}", **{short: f"{record[field]:.0f}"})
            first = False
            bar.update(1)
            if stop_early:
                self.final_step = done
                break
            run.after_step(done, self.total_steps, job.checkpointing.checkpoint_interval, save_anyway=epoch_end or keep)
            if keep:
                run.mark_best(done)
        bar.close()
        run.heartbeat.beat(self.final_step, "export")  # the final save and the report (an export) take their time
        self.before_final_save()
        if self.final_step < self.total_steps:  # a normal end that no restart trains on from (already_finished)
            run.trainer_state["stopped_early"] = self.final_step
            self._say_stopped_early()
        run.save_final(self.final_step)
        if self.best is not None and self.best.step == self.final_step and job.evaluation.keep_best:
            run.mark_best(self.final_step)
        report = self.report() | self._evaluation_report()
        run.finish(start, report, self.family.eval_metric, self.family.lower_is_better)
        self.accelerator.end_training()

    # ------------------------------------------------------------------ the best evaluation, early stopping

    def _best_so_far(self, saved: dict | None) -> BestSoFar | None:
        """What the run judges its evaluations by (None when it does not evaluate), as the checkpoint left it."""
        if not self.evaluates():
            return None
        held_out = self.job.evaluation
        best = BestSoFar(self.family.eval_metric, self.family.lower_is_better, held_out.early_stop_delta or 0.0)
        best.restore(saved)
        self.run.trainer_state["evaluation"] = best.state()  # every later checkpoint carries it, evaluated or not
        if held_out.keep_best and best.step is not None:
            self.run.protect(best.step)
            # a stop or crash between the best's save and its pointer left checkpoints/best naming the one before
            if (self.run.checkpoints.root / step_dir_name(best.step)).is_dir():
                self.run.mark_best(best.step)
        return best

    def _evaluate_at(self, done: int, bar) -> tuple[dict, bool]:
        """Evaluate after step `done`: (its figures, whether to checkpoint this step as the new best)."""
        with self.run.heartbeat.phase("evaluate"):
            figures = self.evaluate()
        if self.accelerator.is_main_process:  # its own line: what SageMaker's eval metrics read
            shown = {name: figures[name] for name in self.family.eval_metrics if name in figures}
            bar.write(eval_line(self.job.run.run_id, done, shown))
        if self.best is None or self.family.eval_metric not in figures:
            return figures, False
        improved = self.best.offer(done, figures)
        self.run.trainer_state["evaluation"] = self.best.state()
        keep = improved and bool(self.job.evaluation.keep_best)
        if keep:
            self.run.protect(done)  # before the save, whose pruning then lets the previous best go
        return figures, keep

    def _patience_ran_out(self) -> bool:
        patience = self.job.evaluation.early_stop_patience
        return bool(patience) and self.best is not None and self.best.stale >= patience

    def _say_stopped_early(self) -> None:
        if self.accelerator.is_main_process:
            print(
                f"stopped early at step {self.final_step}: {self.best.stale} evaluations without an improvement of "
                f"{self.family.eval_metric} (best {self.best.value:.4f} at step {self.best.step})",
                flush=True,
            )

    def _evaluation_report(self) -> dict:
        """summary.json's word on the best checkpoint and an early stop."""
        found: dict = {}
        if self.best is not None and self.job.evaluation.keep_best and self.best.step is not None:
            found["best_checkpoint"] = {
                "step": self.best.step,
                "checkpoint": f"checkpoints/{step_dir_name(self.best.step)}",
            }
        if self.final_step < self.total_steps:
            found["stopped_early"] = {"step": self.final_step, "best_step": self.best.step, "of": self.total_steps}
        return found


def parameter_groups(model: torch.nn.Module, weight_decay: float, embeddings: bool = True) -> list[dict]:
    """Weight decay on matrices only (convolutions, linear layers, and embeddings unless `embeddings` is False);
    biases and normalisation parameters are exempt (their `adapt` flag also keeps them out of LAMB's layer-wise
    trust ratio). The vision recipes and BERT's (whose reference exempts bias, LayerNorm gamma and beta) share it;
    the decoders exempt their token embeddings too (and so a head tied to them), as GPT-style pretraining does."""
    exempt_ids = set()
    if not embeddings:
        exempt_ids = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay, exempt = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim > 1 and id(param) not in exempt_ids else exempt).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay, "adapt": True},
        {"params": exempt, "weight_decay": 0.0, "adapt": False},
    ]
