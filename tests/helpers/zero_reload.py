"""Run under torchrun with any number of processes: the BERT trainer of a ZeRO-1 run (its spec.json) resumes from the
run's latest checkpoint, written by another number of ranks, and every rank's new slice of the fp32 master weights
and of both moments, gathered in the flat layout, must equal what the writing ranks saved, element for element
(DeepSpeed lays each parameter at the same offset whatever the world size: only the padding at the end differs).
Rank 0 prints one JSON line: the step resumed, the world sizes, the elements compared.

    torchrun --nproc-per-node N tests/helpers/zero_reload.py RUN_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from training.common.checkpoint import CHECKPOINTS_DIR, LATEST
from training.common.zero import TAG, saved_world_size
from training.encoder.trainer import BertTrainer
from training.spec import SPEC_FILE, read_job

STATES = ("fp32", "exp_avg", "exp_avg_sq")


def gathered(trainer: BertTrainer) -> list[dict[str, torch.Tensor]]:
    """Per parameter group: each state's slices of every rank, end to end."""
    zero = trainer.engine.optimizer
    found = []
    for flat in zero.single_partition_of_fp32_groups:
        state = zero.optimizer.state[flat]
        mine = {"fp32": flat.detach(), "exp_avg": state["exp_avg"], "exp_avg_sq": state["exp_avg_sq"]}
        whole = {}
        for name, piece in mine.items():
            pieces = [torch.empty_like(piece) for _ in range(dist.get_world_size())]
            dist.all_gather(pieces, piece.contiguous())
            whole[name] = torch.cat(pieces)
        found.append(whole | {"step": state["step"]})
    return found


def saved(checkpoint: Path) -> list[dict[str, torch.Tensor]]:
    """The same, from the optimizer files the writing ranks left."""
    ranks = saved_world_size(checkpoint)
    files = [
        torch.load(next((checkpoint / TAG).glob(f"*zero_pp_rank_{r}_mp_rank_00_optim_states.pt")), weights_only=False)
        for r in range(ranks)
    ]
    groups = []
    for index in range(len(files[0]["optimizer_state_dict"]["single_partition_of_fp32_groups"])):
        per_rank = [f["optimizer_state_dict"] for f in files]
        slices = [s["base_optimizer_state"]["state"][index] for s in per_rank]
        groups.append(
            {
                "fp32": torch.cat([s["single_partition_of_fp32_groups"][index] for s in per_rank]),
                "exp_avg": torch.cat([s["exp_avg"] for s in slices]),
                "exp_avg_sq": torch.cat([s["exp_avg_sq"] for s in slices]),
                "step": slices[0]["step"],
            }
        )
    return groups


def main(run_dir: Path) -> None:
    trainer = BertTrainer(read_job(run_dir / SPEC_FILE), run_dir)
    root = run_dir / CHECKPOINTS_DIR
    checkpoint = root / (root / LATEST).read_text().strip()
    writers = saved_world_size(checkpoint)
    step = trainer.run.resume()
    now = gathered(trainer)
    zero = trainer.engine.optimizer
    compared = 0
    for index, (got, want) in enumerate(zip(now, saved(checkpoint), strict=True)):
        offsets, metas = zero.round_robin_bit16_offsets[index], zero.round_robin_bit16_meta[index]
        used = offsets[-1] + metas[-1].numel()  # the parameters' span: the end padding depends on the world size
        for name in STATES:
            torch.testing.assert_close(got[name][:used], want[name][:used], rtol=0, atol=0, msg=f"group {index} {name}")
        assert int(got["step"]) == int(want["step"]), (got["step"], want["step"])
        compared += used
    if dist.get_rank() == 0:
        print(json.dumps({"step": step, "writers": writers, "world": dist.get_world_size(), "compared": compared}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
