"""Planner numbers against values computed by hand from the formulas in trainkit/plan/memory.py."""

from __future__ import annotations

import pytest

from tests.helpers.published import N7, N13, N70
from trainkit.errors import SpecError
from trainkit.job import build
from trainkit.plan.memory import GIB, PlanOptions, make_plan


def plan_of(mfu=0.40, price_per_hour=None, gpus_per_node=None, **flags):
    """The plan `invoke plan` makes for these flags (job fields, plus the planner's own options)."""
    return make_plan(build({**flags, "nproc": gpus_per_node}), PlanOptions(mfu=mfu, price_per_hour=price_per_hour))


def test_llama2_7b_on_2_p5_full_shard():
    plan = plan_of(model="llama2-7b", nodes=2)
    assert plan.param_count == N7 and plan.world_size == 16
    m = plan.memory_per_gpu["FULL_SHARD"]
    assert m.parameters == 4 * N7 / 16 == 1_684_603_904
    assert m.optimizer == 8 * N7 / 16
    # largest FSDP unit = one decoder layer, 4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096 = 202,383,360
    # parameters (more than the 131,072,000 of the embedding), in bf16, x2 for prefetch
    assert m.gathered_parameters == 2 * 202_383_360 * 2
    # the recipe's GPU default recomputes every 2nd layer: 16 layers x 2sbh (their inputs), the other 16 x 34sbh,
    # plus one 34sbh while a layer is recomputed; s=4096, b=4, h=4096
    sbh = 4096 * 4 * 4096
    assert plan.job.parallelism.ac_every == 2
    assert m.activations == 16 * 2 * sbh + 16 * 34 * sbh + 34 * sbh
    every_layer = plan_of(model="llama2-7b", nodes=2, ac_every=1).memory_per_gpu["FULL_SHARD"]
    assert every_layer.activations == 32 * 2 * sbh + 34 * sbh
    assert (
        plan_of(model="llama2-7b", nodes=2, activation_checkpointing=False).memory_per_gpu["FULL_SHARD"].activations
        == 32 * 34 * sbh
    )
    assert m.logits == 8 * 4096 * 4 * 32000
    assert plan.fits["FULL_SHARD"] and not plan.fits["NO_SHARD"]
    # NO_SHARD: 16 bytes per parameter replicated = 100.4 GiB > 80 GiB
    assert plan.memory_per_gpu["NO_SHARD"].parameters * 4 / GIB == pytest.approx(16 * N7 / GIB)


def test_llama2_13b_hybrid_shards_within_a_node_only():
    plan = plan_of(model="llama2-13b", nodes=4, sharding="HYBRID_SHARD")
    assert plan.param_count == N13 and plan.shard_group == 8
    assert plan.memory_per_gpu["HYBRID_SHARD"].parameters == 4 * N13 / 8


def test_llama2_70b_on_16_nodes_throughput_and_cost():
    plan = plan_of(model="llama2-70b", nodes=16, gpus_per_node=8, mfu=0.4)
    assert plan.param_count == N70
    # global batch raised from the recipe's 64 to fill 128 GPUs at micro batch 1
    assert plan.global_batch_size == 128 and plan.grad_accum_steps == 1
    # FLOPs/token = 6 x (80 layers x 855,654,400 + 32000 x 8192) + 12 x 80 x 8192 x 4096
    flops_per_token = 6 * (80 * 855_654_400 + 32000 * 8192) + 12 * 80 * 8192 * 4096
    assert plan.flops_per_token == flops_per_token
    step_time = flops_per_token * 128 * 4096 / (0.4 * 989e12 * 128)
    assert plan.step_time_s == pytest.approx(step_time)
    assert plan.usd_per_hour == pytest.approx(16 * 98.32)
    assert plan.usd_per_epoch == pytest.approx(16 * 98.32 * 1e8 / (128 * 4096 / step_time) / 3600)


def test_price_override_and_bad_input():
    assert plan_of(model="llama2-7b", price_per_hour=55.0).usd_per_hour == 55.0
    with pytest.raises(SpecError, match="--instance-type 'p9.huge' is unknown"):
        plan_of(model="llama2-7b", instance_type="p9.huge")
    with pytest.raises(SpecError, match="--mfu must be in"):
        plan_of(model="llama2-7b", mfu=1.5)
