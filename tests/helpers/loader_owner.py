"""A training-like process that owns a vision validation loader: reads one batch, prints its loader
worker's pid, then dies the way argv[2] says (`exit`: os._exit as exit_finished does; `kill`: SIGKILL; `term`:
first SIGTERM to its whole process group, as torchrun stops a worker, which the trainer survives here as its own
handler would, then reads another batch and exits as a stopped trainer does, through the interpreter's teardown)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

from training.vision.data import ClassFolder, LoaderSettings, val_loader, val_transform
from training.vision.layout import check_image_folder


def main() -> None:
    root, how = Path(sys.argv[1]), sys.argv[2]
    folder = ClassFolder(str(root / "val"), classes=check_image_folder(root), transform=val_transform(32))
    loader = val_loader(folder, rank=0, world=1, batch=4, settings=LoaderSettings(workers=1))
    batches = iter(loader)
    next(batches)
    print(" ".join(str(worker.pid) for worker in multiprocessing.active_children()), flush=True)
    if how == "term":
        signal.signal(signal.SIGTERM, lambda *_: None)  # the trainer's own stop handler stands here
        os.killpg(os.getpgrp(), signal.SIGTERM)
        time.sleep(1)
        next(batches)  # a worker killed by the signal fails this batch
        print("served after SIGTERM", file=sys.stderr, flush=True)
        sys.exit(0)  # the teardown shuts the workers down: it must not wait for ever
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)


if __name__ == "__main__":
    main()
