"""Run under torchrun --nproc-per-node 2: the replica check must stop a job whose gradients are not averaged."""

import sys
import tempfile
from pathlib import Path

from training.spec import MODEL_CONFIG, Job
from training.vision.trainer import VisionTrainer

job = Job()
job.model.name, job.model.family = "resnet-tiny", "vision"
job.data.synthetic, job.data.image_size, job.data.loader_workers = True, 32, 0
o = job.optimisation
o.steps, o.global_batch_size, o.micro_batch_size, o.warmup_steps = 1, 4, 2, 0
o.lr, o.optimizer, o.weight_decay, o.label_smoothing, o.grad_clip = 0.1, "sgd", 1e-4, 0.1, 0.0
job.checkpointing.checkpoint_interval, job.run.metrics_port = 0, 0

with tempfile.TemporaryDirectory() as folder:
    run_dir = Path(folder)
    (run_dir / MODEL_CONFIG).write_text('{"num_classes": 10}')
    trainer = VisionTrainer(job, run_dir)
    print("digests agree after prepare:", trainer.replica_digests(), flush=True)
    trainer.model = trainer.accelerator.unwrap_model(trainer.model)  # each rank now trains alone
    trainer.begin(0)
    trainer.train_step(0)  # each rank's own random batch
    try:
        trainer.replica_digests()
    except RuntimeError as error:
        print(f"refused: {error}", flush=True)
        trainer.accelerator.end_training()
        sys.exit(0)
    sys.exit("replica check let unsynchronised replicas through")
