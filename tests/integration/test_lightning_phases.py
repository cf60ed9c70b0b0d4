"""training/lightning.py's WatchdogPhases on a real Lightning 2.6 Trainer (CPU, one process): every save the
ModelCheckpoint callback makes, and every validation, runs in the phase the stall watchdog gives the longer allowance,
and the steps after them are steps again; every optimizer step beats, also in a script that never calls report_step;
each save's seconds become a `checkpoint` event, which the watchdog's next round allows ten times of. In-process;
Lightning is imported only here and by the example."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning")

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from training.common import heartbeat  # noqa: E402
from training.common.files import read_events  # noqa: E402
from training.lightning import WatchdogPhases  # noqa: E402


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Watched(Callback):
    """What the rank's phase was while the file was written (the last callback, after ModelCheckpoint's write it
    cannot see: it checks at the save's own hook and just after)."""

    def __init__(self, seen: list):
        self.seen = seen

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.seen.append(("validating", heartbeat.process_heartbeat().current))


def test_saves_and_validations_are_the_watchdogs_slow_phases(tmp_path, monkeypatch):
    monkeypatch.setenv(heartbeat.HEARTBEAT_DIR_ENV, str(tmp_path / "beats"))
    monkeypatch.setenv("TRAINKIT_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("RANK", raising=False)
    (tmp_path / "beats").mkdir()
    beats = []
    monkeypatch.setattr(heartbeat, "_process", None)
    original = heartbeat.Heartbeat.beat
    monkeypatch.setattr(
        heartbeat.Heartbeat,
        "beat",
        lambda self, step, phase="step": beats.append((step, phase)) or original(self, step, phase),
    )
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_last=True)
    seen: list = []
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=4,
        val_check_interval=2,
        num_sanity_val_steps=0,
        callbacks=[checkpoints, WatchdogPhases(), Watched(seen)],  # no report_step: the callback alone
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    saved_in = []
    write = trainer.strategy.save_checkpoint  # what writes the file, after the checkpoint's dict is made

    def watched_write(*args, **kwargs):
        saved_in.append(heartbeat.process_heartbeat().current)
        return write(*args, **kwargs)

    monkeypatch.setattr(trainer.strategy, "save_checkpoint", watched_write)
    trainer.fit(Tiny(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=8))
    assert saved_in and set(saved_in) == {"checkpoint"}, saved_in  # every file written inside the phase
    assert seen and set(seen) == {("validating", "evaluate")}
    assert sorted({step for step, phase in beats if phase == "step"}) == [1, 2, 3, 4]  # every step beats
    # each save and validation ends before the next step is done: the next beat of another phase is a step's, at
    # the same step (the phase left at the next hook), not the next step's beat
    for index, (step, phase) in enumerate(beats):
        if phase in ("checkpoint", "evaluate"):
            after = next(beat for beat in beats[index + 1 :] if beat[1] != phase)
            assert after in ((step, "step"), (step, "checkpoint"), (step, "evaluate")), (index, beats)
    assert beats[-1][1] == "step"
    saves = [e for e in read_events(tmp_path / "run") if e["event"] == "checkpoint"]
    assert [e["step"] for e in saves] == [2, 4] and all(e["seconds"] >= 0 for e in saves), saves
