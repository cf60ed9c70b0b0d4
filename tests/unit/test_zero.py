"""DeepSpeed ZeRO-1's glue (training/common/zero.py) without processes: the engine's configuration, how many ranks
wrote a checkpoint, the set-up that builds DeepSpeed, and its checkpoints loaded weights-only by a real engine in a
gloo world of one, a planted pickle refused. With processes: tests/e2e/test_bert_train.py."""

from __future__ import annotations

import copy
import os
import random
import shutil
import subprocess

import pytest
import torch
import torch.distributed as dist

from tests.helpers.guards import RefusedPopen
from tests.helpers.planted import REFUSED, Planted, plant_and_load
from training.common.lamb import Lamb
from training.common.sharded_lamb import PartitionLamb
from training.common.trainer import parameter_groups
from training.common.weights_only import FORCE_ENV, RefusedCheckpoint, load_weights_only, weights_only_loads
from training.common.zero import (
    TAG,
    ZeroCheckpoint,
    _universal_load,
    convert_to_universal,
    engine_config,
    initialize,
    saved_world_size,
)


def test_the_engine_steps_when_the_trainer_says_and_partitions_the_optimizer_only():
    config = engine_config(micro_batch_size=16, micro_steps=24, grad_clip=1.0, bf16=True)
    assert config["zero_optimization"] == {"stage": 1}
    assert config["managed_gradient_accumulation"] is False  # the trainer's step is the boundary
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (16, 24)
    assert config["gradient_clipping"] == 1.0 and config["bf16"] == {"enabled": True}
    assert "train_batch_size" not in config  # a rank's share may be one short of the others' (uneven batches)


def test_under_bf16_gradients_accumulate_and_reduce_in_fp32_and_lamb_gets_whole_norms(zero_state, tmp_path):
    """bf16 (issue 50): DeepSpeed's BF16_Optimizer adds each micro batch's bf16 gradients into fp32 and reduces
    them in fp32; LAMB on its slice (partition_layout) takes the step LAMB takes on whole fp32 parameters with those
    fp32 sums. Two parameter groups, so the layout is read per group; LAMB's trust ratios in the first. Then its
    checkpoint goes through ZeroCheckpoint and back, weights-only."""
    assert engine_config(2, 1, 1.0, bf16=False).get("data_types") is None  # fp32: DeepSpeed's ZeRO-1 as before
    torch.manual_seed(1)
    layers = torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 5), torch.nn.Linear(5, 3)
    model = torch.nn.Sequential(*layers)
    master = [p.detach().to(torch.bfloat16).float() for p in model.parameters()]  # DeepSpeed's: the bf16 module's
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    groups = parameter_groups(model, weight_decay=0.01)
    index = {id(p): i for i, p in enumerate(model.parameters())}
    members = [[index[id(p)] for p in group["params"]] for group in groups]  # DeepSpeed replaces the lists
    settings = [{key: value for key, value in group.items() if key != "params"} for group in groups]  # decay, adapt
    optimizer = PartitionLamb(groups, lr=0.01)
    with pytest.MonkeyPatch.context() as env:
        env.setattr(subprocess, "Popen", RefusedPopen)
        engine = initialize(model, optimizer, engine_config(2, 2, 0.0, bf16=True))
    assert type(engine.optimizer).__name__ == "BF16_Optimizer" and engine.communication_data_type == torch.float32
    batches = [torch.randn(2, 4), torch.randn(2, 4)]
    summed = [torch.zeros_like(p) for p in master]  # what the fp32 buffer must hold: the bf16 gradients' fp32 sum
    for batch in batches:
        engine.backward(engine(batch.to(torch.bfloat16)).float().square().sum(), scale_wrt_gas=False)
        bf16.zero_grad()
        bf16(batch.to(torch.bfloat16)).float().square().sum().backward()
        for total, param in zip(summed, bf16.parameters(), strict=True):
            total += param.grad.float()
    engine.step()
    reference = [torch.nn.Parameter(p) for p in master]
    by_group = [{**kept, "params": [reference[i] for i in m]} for m, kept in zip(members, settings, strict=True)]
    for param, total in zip(reference, summed, strict=True):
        param.grad = total
    Lamb(by_group, lr=0.01, betas=(0.9, 0.999), eps=1e-6).step()
    for flat, held in zip(engine.optimizer.fp32_groups_flat_partition, members, strict=True):  # each padded
        expected = torch.cat([reference[i].detach().flatten() for i in held])
        assert torch.allclose(flat[: expected.numel()], expected, rtol=1e-5, atol=1e-7)
    assert not torch.equal(expected, torch.cat([p.flatten() for p in master]))  # the step moved something
    # BF16_Optimizer's checkpoint: saved by ZeroCheckpoint, loaded weights-only, its master weights as they were
    scheduler = torch.optim.lr_scheduler.LambdaLR(engine.optimizer.optimizer, lambda step: 1.0)
    state = ZeroCheckpoint(engine, scheduler, world=1, rank=0)
    state.save(tmp_path / "step-00000001")
    assert saved_world_size(tmp_path / "step-00000001") == 1  # bf16_zero_pp_rank_0_...
    saved = [flat.detach().clone() for flat in engine.optimizer.fp32_groups_flat_partition]
    with torch.no_grad():
        for flat in engine.optimizer.fp32_groups_flat_partition:
            flat.zero_()
    load_weights_only(tmp_path / "step-00000001", state.load, state.safe_globals)
    assert all(torch.equal(a, b) for a, b in zip(saved, engine.optimizer.fp32_groups_flat_partition, strict=True))


@pytest.mark.parametrize("prefix", ["", "bf16_"])
def test_a_checkpoint_knows_how_many_ranks_wrote_it(tmp_path, prefix):
    checkpoint = tmp_path / "step-00000020"
    (checkpoint / TAG).mkdir(parents=True)
    for rank in range(4):
        (checkpoint / TAG / f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"x")
    (checkpoint / TAG / "mp_rank_00_model_states.pt").write_bytes(b"x")
    assert saved_world_size(checkpoint) == 4


def test_the_set_up_builds_the_deepspeed_the_project_pins():
    """`make setup` builds DeepSpeed itself (its CPU op compiled in) before installing the project: the same
    version, or pip would replace it with an op-less build."""
    import re
    import tomllib

    from tests.helpers.paths import REPO

    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (pinned,) = [pin.split("==")[1] for pin in pins if pin.startswith("deepspeed==")]
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^DEEPSPEED_VERSION = (\S+)$", makefile, re.M).group(1) == pinned
    assert "DS_BUILD_SHM_COMM=" in makefile and "--no-build-isolation deepspeed==$(DEEPSPEED_VERSION)" in makefile


# --------------------------------------------------------------------------- loading weights-only


@pytest.fixture(scope="module")
def zero_state(tmp_path_factory):
    """A real ZeRO-1 engine (LAMB on partitions, as BERT's recipe) in a gloo world of one process, one step taken and
    checkpointed by ZeroCheckpoint.save: (the state, the engine, the schedule, the checkpoint folder)."""
    folder = tmp_path_factory.mktemp("zero")
    with pytest.MonkeyPatch.context() as env:
        env.setattr(subprocess, "Popen", RefusedPopen)  # set up before the layer's own guard: DeepSpeed's op probes
        env.setenv("LOCAL_RANK", "0")  # DeepSpeed asks for torchrun's variable
        dist.init_process_group("gloo", init_method=f"file://{folder / 'group'}", rank=0, world_size=1)
        try:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
            optimizer = PartitionLamb(model.parameters(), lr=0.01)
            engine = initialize(model, optimizer, engine_config(2, 1, 1.0, bf16=False))
            scheduler = torch.optim.lr_scheduler.LambdaLR(engine.optimizer.optimizer, lambda step: 1.0 / (step + 1))
            engine.backward(engine(torch.ones(2, 4)).sum())
            engine.step()
            scheduler.step()
            state = ZeroCheckpoint(engine, scheduler, world=1, rank=0)
            state.save(folder / "step-00000001")
            yield state, engine, scheduler, folder / "step-00000001"
        finally:
            dist.destroy_process_group()


def test_a_zero_checkpoint_resumes_with_every_load_weights_only(zero_state):
    state, engine, scheduler, folder = zero_state
    saved = [p.detach().clone() for p in engine.module.parameters()]
    draw = random.random()
    with torch.no_grad():
        for param in engine.module.parameters():
            param.zero_()
    scheduler.step()
    load_weights_only(folder, state.load, state.safe_globals)
    assert all(torch.equal(p, q) for p, q in zip(engine.module.parameters(), saved, strict=True))
    assert scheduler.last_epoch == 1
    assert random.random() == draw  # the RNG file, numpy's state in it, came back
    assert FORCE_ENV not in os.environ


@pytest.mark.parametrize(
    "name",
    [f"{TAG}/rng_state_0.pt", f"{TAG}/mp_rank_00_model_states.pt", f"{TAG}/zero_pp_rank_0_mp_rank_00_optim_states.pt"],
)
def test_a_pickle_planted_in_a_zero_checkpoint_is_refused_by_name_and_never_runs(zero_state, tmp_path, name):
    """The RNG file is trainkit's own, loaded with weights_only=False before; DeepSpeed loads the others so."""
    state, _, _, folder = zero_state
    plant_and_load(state, folder, tmp_path, name)


def test_the_universal_conversion_and_its_load_are_weights_only(zero_state, tmp_path):
    """DeepSpeed's conversion (ds_to_universal.py) and universal load torch.load with weights_only=False: under the
    load's forcing the conversion and a load of its output work, and a file that names code stops the conversion
    (here one the check before the load does not read: torch's old, non-zip format)."""
    state, engine, _, folder = zero_state
    with weights_only_loads(state.safe_globals):
        convert_to_universal(folder / TAG, tmp_path / "universal" / TAG)
        with _universal_load(engine, True):
            path, client = engine.load_checkpoint(str(tmp_path / "universal"), tag=TAG, load_lr_scheduler_states=False)
    assert path is not None and client["scheduler"]["last_epoch"] == 1
    planted = tmp_path / "step-00000001"
    shutil.copytree(folder, planted)
    optimizer_file = planted / TAG / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"state": Planted(tmp_path / "ran")}, optimizer_file, _use_new_zipfile_serialization=False)
    load_weights_only(planted, lambda checkpoint: None, state.safe_globals)  # the check cannot read the old format
    with pytest.raises(RefusedCheckpoint) as refused, weights_only_loads(state.safe_globals):
        convert_to_universal(planted / TAG, tmp_path / "again" / TAG)
    assert str(refused.value) == f"a file {REFUSED}"
    assert not (tmp_path / "ran").exists()
