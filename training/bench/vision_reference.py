"""The bare reference of `invoke bench train` for vision models: the plain DDP loop a user would write.

Run under torchrun on a run folder trainkit prepared (its spec.json, model config and image tree):

    torchrun --standalone --nproc-per-node 2 -m training.bench.vision_reference --spec runs/<id>/spec.json --out r.json

torchvision's ImageFolder over train/ with the standard ImageNet augmentation (random resized crop, flip,
normalisation), a DistributedSampler, a DataLoader with the job's loader workers (persistent, pinned memory on
GPUs), the same torchvision model (channels_last on GPUs), DistributedDataParallel, SGD with Nesterov momentum at
the job's learning rate, gradient accumulation with no_sync, bf16 autocast when the job's precision resolves to
bf16. Left out is what trainkit adds: the warm-up/cosine schedule, per-image seeded augmentation (resume-exact),
evaluation, checkpoints, metrics, elastic restarts. Loader workers are spawned as trainkit's are
(training/vision/data.py says why forking a process that holds Gloo threads can hang). Steps are timed like
trainkit's: input wait (the step's micro batches from the loader and onto the device), forward and backward,
optimizer (the device synchronised at each edge); rank 0 writes every step to --out.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import time
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms

from training.bench import timing
from training.spec import MODEL_CONFIG, data_source
from training.vision.models import build_model

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def main(argv: list[str] | None = None) -> NoReturn:
    ctx = timing.setup(argv, __doc__.splitlines()[0])
    job, run_dir, gpu, local_rank, device, bf16 = ctx.job, ctx.run_dir, ctx.gpu, ctx.local_rank, ctx.device, ctx.bf16
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(job.run.seed)

    size = job.data.image_size
    augment = transforms.Compose(
        [
            transforms.RandomResizedCrop(size, antialias=True),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ]
    )
    images = datasets.ImageFolder(str(Path(data_source(job, run_dir)) / "train"), transform=augment)
    opt = job.optimisation
    per_rank, micro = opt.global_batch_size // world, opt.micro_batch_size
    if per_rank * world != opt.global_batch_size or per_rank % micro:
        raise SystemExit(f"global batch {opt.global_batch_size} does not split into {world} x micro batches of {micro}")
    sampler = DistributedSampler(images, num_replicas=world, rank=rank, shuffle=True, seed=job.run.seed, drop_last=True)
    workers = job.data.loader_workers
    loader = DataLoader(
        images,
        batch_size=micro,
        sampler=sampler,
        drop_last=True,
        num_workers=workers,
        pin_memory=gpu,
        persistent_workers=workers > 0,
        multiprocessing_context=multiprocessing.get_context("spawn") if workers else None,
    )

    num_classes = json.loads((run_dir / MODEL_CONFIG).read_text())["num_classes"]
    memory_format = torch.channels_last if gpu else torch.contiguous_format
    model = build_model(job.model.name, num_classes).to(device, memory_format=memory_format)
    model = DistributedDataParallel(model, device_ids=[local_rank] if gpu else None)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=opt.lr, momentum=0.9, nesterov=True, weight_decay=opt.weight_decay
    )

    def batches():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    stream = batches()
    accumulation = per_rank // micro
    steps = []
    for step in range(opt.steps):
        started = time.perf_counter()
        micro_batches = []
        for _ in range(accumulation):
            pixels, labels = next(stream)
            pixels = pixels.to(device, non_blocking=True, memory_format=memory_format)
            micro_batches.append((pixels, labels.to(device, non_blocking=True)))
        data_s = time.perf_counter() - started
        model.train()
        loss_sum = torch.zeros((), device=device)
        for index, (pixels, labels) in enumerate(micro_batches):
            last = index == accumulation - 1
            with contextlib.nullcontext() if last else model.no_sync():
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    logits = model(pixels)
                loss = F.cross_entropy(logits.float(), labels, label_smoothing=opt.label_smoothing)
                (loss / accumulation).backward()
            loss_sum += loss.detach() / accumulation
        optimizer_s = timing.optimizer_phase(model, optimizer, opt.grad_clip)
        dist.all_reduce(loss_sum)
        rate = {"samples_per_s": opt.global_batch_size}
        steps.append(timing.step_record(step + 1, loss_sum.item() / world, started, data_s, optimizer_s, rate))
    what = "bare DDP reference loop (training/bench/vision_reference.py)"
    timing.finish(ctx.out, {"what": what, "precision": "bf16" if bf16 else "fp32"}, steps)


if __name__ == "__main__":
    main()
