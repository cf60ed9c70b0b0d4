"""Run under torchrun --nproc-per-node 2: the replica check must stop a job whose gradients are not averaged."""

import sys
import tempfile

from training.vision.config import VisionConfig
from training.vision.trainer import VisionTrainer

with tempfile.TemporaryDirectory() as run_dir:
    trainer = VisionTrainer(
        VisionConfig(
            run_dir=run_dir,
            model_name="resnet-tiny",
            synthetic=True,
            num_classes=10,
            steps=1,
            global_batch_size=4,
            micro_batch_size=2,
            image_size=32,
            loader_workers=0,
        )
    )
    print("digests agree after prepare:", trainer.replica_digests(), flush=True)
    trainer.model = trainer.accelerator.unwrap_model(trainer.model)  # each rank now trains alone
    trainer.train_step(0, trainer._micro_batches(0))  # each rank's own random batch
    try:
        trainer.replica_digests()
    except RuntimeError as error:
        print(f"refused: {error}", flush=True)
        trainer.accelerator.end_training()
        sys.exit(0)
    sys.exit("replica check let unsynchronised replicas through")
