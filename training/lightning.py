"""A Lightning Trainer's slow work, told to trainkit's stall watchdog (trainkit/run/watchdog.py):

    from training.lightning import WatchdogPhases
    trainer = L.Trainer(..., callbacks=[ModelCheckpoint(...), WatchdogPhases(), ...])

Without it a checkpoint or a validation longer than 10 x the median step (at least 60 s) looks like a stall to the
watchdog, which ends the job and restarts it from the checkpoint before (a script's steps beat through
training.script.report_step; its saves say nothing). With it, validation is an `evaluate` phase and every save a
`checkpoint` phase, which the watchdog allows what it allows a recipe's (training/script.py `phase`).

Written against Lightning 2.6's hooks (lightning/pytorch/callbacks/callback.py, and trainer/trainer.py
`save_checkpoint`: the callbacks' `on_save_checkpoint` runs in `dump_checkpoint`, before the strategy writes the
file, and no hook follows the write). So a save's phase starts at `on_save_checkpoint` and ends at the next hook the
Trainer calls after it: the next batch's or epoch's start, a validation's start, or the end of training.
ModelCheckpoint saves from its own batch-end, validation-end and epoch-end hooks, which Lightning runs after every
other callback's (trainer/connectors/callback_connector.py `_reorder_callbacks`).

Lightning is not a trainkit dependency: this module imports it, so only a script that uses Lightning imports this.
"""

from __future__ import annotations

import time

from lightning.pytorch.callbacks import Callback

from training.common.heartbeat import process_heartbeat
from training.script import record_checkpoint


class WatchdogPhases(Callback):
    """Validation as the watchdog's `evaluate` phase, each save as its `checkpoint` phase (rank 0 records each save's
    seconds, as training.script.phase does); every optimizer step is a beat too, so a script that does not call
    report_step is watched from its first step, not only from its first save or validation."""

    def __init__(self) -> None:
        self._before: str | None = None
        self._saving_since: float | None = None

    def _enter(self, name: str) -> None:
        heartbeat = process_heartbeat()
        if name == "checkpoint" and self._saving_since is None:
            self._saving_since = time.monotonic()
        if heartbeat.current == name:
            return
        before = heartbeat.enter(name)
        if self._before is None:
            self._before = before

    def _leave(self) -> None:
        heartbeat = process_heartbeat()
        if self._saving_since is not None:
            record_checkpoint(heartbeat.step, time.monotonic() - self._saving_since)
            self._saving_since = None
        if self._before is not None:
            heartbeat.beat(heartbeat.step, self._before)
            self._before = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._enter("checkpoint")

    def on_validation_start(self, trainer, pl_module) -> None:
        self._leave()
        self._enter("evaluate")

    def on_validation_end(self, trainer, pl_module) -> None:
        self._leave()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._leave()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # Lightning's global_step counts optimizer steps; the same step beaten twice (report_step too) is one.
        process_heartbeat().beat(trainer.global_step)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._leave()

    def on_train_end(self, trainer, pl_module) -> None:
        self._leave()
