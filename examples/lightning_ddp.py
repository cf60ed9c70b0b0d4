"""A PyTorch Lightning (2.x) DDP script in the shape of the SageMaker reference, run by trainkit:

    invoke run --script examples/lightning_ddp.py --nodes 1:2 --nproc 2 -- --steps 60

The shape of aws/amazon-sagemaker-examples' Lightning DDP example (a LightningModule and a LightningDataModule,
`Trainer(strategy=DDPStrategy(...), devices=..., num_nodes=...)` with the process counts taken from the
environment the launcher made): here torchrun's, which Lightning recognises by itself (its TorchElasticEnvironment:
RANK, GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE), so the same script runs on one machine or on every pod of an EKS
job, and with an elastic node range the node count is read at each (re)start. Checkpoints go to trainkit's
checkpoint folder (training/script.py: checkpoint_dir()); at start the trainer resumes from `last.ckpt` there if
an earlier attempt left one, so a restart after a lost process or node, or the same command again, carries on.
A callback reports every step to the run's metrics.jsonl and Prometheus (report_step); trainkit's WatchdogPhases
(training/lightning.py) tells the stall watchdog when the trainer saves or validates, which may take far longer
than a step.
"""

from __future__ import annotations

import argparse
import os
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from training.lightning import WatchdogPhases
from training.script import checkpoint_dir, report_step, run_dir


class Regression(L.LightningModule):
    def __init__(self, lr: float):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class SyntheticData(L.LightningDataModule):
    """The same data on every rank and every restart: y = sin(x . w) for fixed w, plus a little noise."""

    def __init__(self, samples: int, batch_size: int):
        super().__init__()
        self.samples, self.batch_size = samples, batch_size

    def setup(self, stage: str) -> None:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(self.samples, 16, generator=generator)
        w = torch.randn(16, generator=generator)
        y = torch.sin(x @ w).unsqueeze(1) + 0.01 * torch.randn(self.samples, 1, generator=generator)
        self.data = TensorDataset(x, y)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True, drop_last=True)  # Lightning shards it


class ReportSteps(Callback):
    """Each optimizer step into trainkit's metrics (rank 0 writes metrics.jsonl; every rank's gauges move)."""

    def __init__(self, sleep_s: float):
        self.sleep_s = sleep_s

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        report_step(trainer.global_step, loss=float(loss), lr=trainer.optimizers[0].param_groups[0]["lr"])
        time.sleep(self.sleep_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="Optimizer steps in all.")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=16, help="Per process.")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--save-every", type=int, default=5, help="Steps between checkpoints.")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="Seconds each step waits (to watch it run).")
    args = parser.parse_args()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    nodes = int(os.environ.get("WORLD_SIZE", per_node)) // per_node
    folder = checkpoint_dir()
    checkpoints = ModelCheckpoint(dirpath=folder, every_n_train_steps=args.save_every, save_last=True, save_top_k=1)
    trainer = L.Trainer(
        accelerator="gpu" if torch.cuda.is_available() else "cpu",
        devices=per_node,
        num_nodes=nodes,
        strategy=DDPStrategy(process_group_backend="nccl" if torch.cuda.is_available() else "gloo"),
        max_steps=args.steps,
        callbacks=[checkpoints, ReportSteps(args.step_sleep), WatchdogPhases()],
        default_root_dir=run_dir(),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    last = folder / "last.ckpt"
    if trainer.is_global_zero and last.exists():
        print(f"resuming from {last}", flush=True)
    trainer.fit(
        Regression(args.lr), SyntheticData(args.samples, args.batch_size), ckpt_path=last if last.exists() else None
    )
    if torch.distributed.is_initialized():
        # Lightning leaves its process group open; a rank that exits while its peer is still closing the group's
        # connections can abort in gloo's teardown (seen on two hosts). Leave together, then close it.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    if trainer.is_global_zero:
        loss = trainer.callback_metrics.get("train_loss")  # none when a finished run is started again: no step ran
        shown = f"{float(loss):.4f}" if loss is not None else "-"
        print(f"finished: step {trainer.global_step}, loss {shown}")


if __name__ == "__main__":
    main()
